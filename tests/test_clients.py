"""The public clients, unchanged, on genlm-core through genlm-compat.

genlm-control 0.4.1 and llamppl 0.2.3 are installed from PyPI (scripts/setup_env.sh,
``--no-deps`` for their genlm-backend requirement); the programs below are written
the way their documentation shows, offline, on the tiny test models and SmolLM2-135M
(float32). Oracles: every sampled sequence is checked against its constraint with
Python's ``re`` (not the clients' automata); deterministic quantities are recomputed
with genlm-core's own API (a backend from ``genlm_core.load``, the core byte beam,
a brute-force trie sum).
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

import numpy as np
import pytest
import torch
from model_paths import smollm2, tiny_llama

pytest.importorskip("genlm.control", reason="genlm-control is installed by scripts/setup_env.sh")
pytest.importorskip("llamppl", reason="llamppl is installed by scripts/setup_env.sh")
pytest.importorskip("genlm.backend", reason="genlm-compat (plugins/genlm_compat) is not importable")

import genlm_core  # noqa: E402
from genlm_core.bytes import BeamParams as CoreBeamParams  # noqa: E402
from genlm_core.bytes import ByteBeamState as CoreByteBeamState  # noqa: E402
from genlm_core.testing.tolerance import assert_tiny_close, row_atol, row_magnitude, tiny_shape  # noqa: E402

# float32 logits of one model recomputed in a batch of another shape (padding, KV reuse):
# the sums reorder; held to the bound derived from that arithmetic
# (genlm_core.testing.tolerance) for the tiny model and each row's magnitude.


def tiny_bound(row: Any) -> float:
    """The derived bound for two float32 computations of a tiny model's ``row``."""
    import torch

    return row_atol(tiny_shape(), row_magnitude(torch.as_tensor(row)))


def core_hf(path: Any) -> Any:
    """The same model through genlm-core's own API (the oracle side)."""
    return genlm_core.load("hf", model=str(path), dtype="float32", device="cpu")


def decoded(context: list[Any]) -> bytes:
    """The bytes of a genlm-control context (Tokens, then its EOS object)."""
    from genlm.control import EOS

    return b"".join(bytes(t) for t in context if t is not EOS and not (hasattr(t, "type_") and t == EOS))


def check_sequences(seqs: Any, pattern: str) -> None:
    """Every particle with non-zero weight ends in EOS and matches ``pattern``; weights
    are finite or -inf (never NaN), and some particle survived."""
    from genlm.control import EOS

    finite = 0
    for ctx, lw in zip(seqs.contexts, seqs.log_weights):
        assert not math.isnan(lw)
        if lw == -math.inf:
            continue
        finite += 1
        assert ctx and ctx[-1] == EOS, ctx
        text = decoded(ctx).decode("utf-8", errors="replace")
        assert re.fullmatch(pattern, text), (text, pattern)
    assert finite > 0, seqs.log_weights


def test_prompted_llm_logprobs_equal_the_core() -> None:
    """PromptedLLM's next-token weights are the core backend's logprobs (EOS moved last)."""
    from genlm.control import PromptedLLM

    async def main() -> None:
        llm = PromptedLLM.from_name(str(tiny_llama()), backend="hf", hf_opts={"torch_dtype": "float"})
        llm.set_prompt_from_str("the cat")
        ctx = llm.tokenize(" sat on")
        got = (await llm.logw_next(ctx)).weights
        core = core_hf(tiny_llama())
        want = core.next_token_logprobs_sync(llm.prompt_ids + [t.token_id for t in ctx]).numpy()
        eos = llm.token_maps.eos_idxs
        rest = [i for i in range(len(want)) if i not in eos]
        assert_tiny_close(np.asarray(got)[:-1], want[rest], "PromptedLLM's weights")
        # a logsumexp of entries each within the row's bound is within it too
        assert abs(np.asarray(got)[-1] - np.logaddexp.reduce(want[eos])) <= tiny_bound(want)
        core.close()

    asyncio.run(main())


@pytest.mark.slow
def test_awrs_regex_smollm2() -> None:
    """genlm-control's README program: PromptedLLM + BoolFSA.from_regex through AWRS/SMC."""
    from genlm.control import AWRS, BoolFSA, PromptedLLM

    pattern = r" SMC is (good|great|fine) with LMs"

    async def main() -> None:
        llm = PromptedLLM.from_name(str(smollm2()), backend="hf", hf_opts={"torch_dtype": "float"})
        llm.set_prompt_from_str("Here is my honest opinion:")
        fsa = BoolFSA.from_regex(pattern)
        sampler = AWRS(llm, fsa.coerce(llm, f=b"".join))
        torch.manual_seed(0)
        np.random.seed(0)
        seqs = await sampler.smc(n_particles=4, ess_threshold=0.5, max_tokens=16)
        check_sequences(seqs, pattern)
        await sampler.cleanup()

    asyncio.run(main())


def test_grammar_eager_smc_tiny() -> None:
    """A BoolCFG (Lark grammar, byte level) through the eager set sampler and SMC;
    checked against an equivalent regex. (AWRS on the random tiny model trips
    genlm-control's own float tolerance when nearly all mass is rejected; AWRS runs
    on SmolLM2 above.)"""
    from genlm.control import BoolCFG, PromptedLLM, eager_token_sampler

    grammar = 'start: WORD " " WORD\nWORD: "cat" | "dog" | "bird"'
    pattern = r"(cat|dog|bird) (cat|dog|bird)"

    async def main() -> None:
        llm = PromptedLLM.from_name(str(tiny_llama()), backend="hf", hf_opts={"torch_dtype": "float"})
        llm.set_prompt_from_str("Two animals:")
        sampler = eager_token_sampler(llm, BoolCFG.from_lark(grammar))
        torch.manual_seed(1)
        np.random.seed(1)
        seqs = await sampler.smc(n_particles=6, ess_threshold=0.5, max_tokens=12)
        check_sequences(seqs, pattern)
        await sampler.cleanup()

    asyncio.run(main())


def test_topk_set_sampler_uses_the_core_trie() -> None:
    """topk_token_sampler builds a trie over the LLM vocabulary minus EOS plus its EOS
    object (positions != token ids): masses equal a brute-force sum, sequences match."""
    from genlm.control import EOS, BoolFSA, PromptedLLM, topk_token_sampler

    pattern = r"(ab|ba)c"

    async def main() -> None:
        llm = PromptedLLM.from_name(str(tiny_llama()), backend="hf", hf_opts={"torch_dtype": "float"})
        llm.set_prompt_from_str("Letters:")
        fsa = BoolFSA.from_regex(pattern)
        sampler = topk_token_sampler(llm, fsa, K=8)
        trie = sampler.set_sampler.trie
        vocab = llm.vocab_eos
        assert vocab[-1] is EOS and trie.leaf2word[trie.word2leaf[EOS]] is EOS
        w = np.random.default_rng(0).random(len(vocab))
        m = await sampler.set_sampler.trie_executor.weight_sum(w)
        for key, node in trie.children[trie.root].items():
            if not isinstance(key, int):  # the EOS symbol's edge, leaves
                continue
            pre = bytes(trie.node2prefix[node])
            want = sum(w[i] for i, t in enumerate(vocab) if t is not EOS and bytes(t).startswith(pre))
            # float32 masses, as genlm-backend's ParallelTokenCharacterTrie gives: weights and
            # results rounded to float32 (2 * 2**-24 relative) around a float64 sum
            assert m[node] == pytest.approx(want, rel=2e-7)
        assert m[trie.children[trie.root][EOS]] == pytest.approx(w[-1])
        mx = await sampler.set_sampler.trie_executor.weight_max(np.log(w))
        assert mx[trie.root] == pytest.approx(np.log(w.max()))
        torch.manual_seed(2)
        np.random.seed(2)
        seqs = await sampler.smc(n_particles=4, ess_threshold=0.5, max_tokens=8)
        check_sequences(seqs, pattern)
        await sampler.cleanup()

    asyncio.run(main())


def test_bytellm_prefix_equals_the_core_beam() -> None:
    """genlm-control's ByteLLM potential: prefix weights are the core beam's logZ."""
    from genlm.backend import load_model_by_name
    from genlm.bytes import BeamParams
    from genlm.control import ByteLLM

    async def main() -> None:
        llm = load_model_by_name(
            str(tiny_llama()), backend="hf", llm_opts={"hf_opts": {"torch_dtype": "float"}}
        )
        eos = bytes(llm.byte_vocab[llm.tokenizer.eos_token_id])
        params = BeamParams(K=5, eos_byte_strings=[eos], heal=True)
        text = b" the cat"
        async with ByteLLM(llm, params) as byte_llm:
            byte_llm.set_prompt_from_str("Hello")
            got = await byte_llm.prefix([text[i : i + 1] for i in range(len(text))])
            nxt = await byte_llm.logw_next([text[i : i + 1] for i in range(len(text))])
        core = core_hf(tiny_llama())
        cp = CoreBeamParams(K=5, eos_tokens=[eos], heal=True)
        beam = await CoreByteBeamState.initial(core, cp)
        beam = await beam.prefill(b"Hello")
        base = beam.logZ
        for b in text:
            beam = await (beam.prune() << b)
        # the same beam over the same float32 logprobs; logZ sums one logprob per byte's
        # token at most, each within its row's derived bound
        bound = len(text) * tiny_bound(core.next_token_logprobs_sync(core.tokenizer.encode("Hello")))
        assert got == pytest.approx(beam.logZ - base, abs=bound)
        ps = np.asarray(nxt.weights)
        assert np.isfinite(ps[:256]).any() and not np.isnan(ps).any()
        await beam.cleanup()
        core.close()

    asyncio.run(main())


def test_llamppl_model_with_lmcontext() -> None:
    """llamppl's README model (a forbidden letter, LMContext, smc_standard)."""
    from llamppl import CachedCausalLM, LMContext, Model, smc_standard

    class NoLetter(Model):
        def __init__(self, lm: Any, prompt: str, letter: str) -> None:
            super().__init__()
            self.context = LMContext(lm, prompt)
            self.eos_token = lm.tokenizer.eos_token_id
            self.forbidden = {i for i, v in enumerate(lm.vocab) if letter in v}
            self.n = 0

        async def step(self) -> None:
            await self.observe(self.context.mask_dist(self.forbidden), False)
            token = await self.sample(self.context.next_token())
            self.n += 1
            if token.token_id == self.eos_token or self.n >= 6:
                self.finish()

        def immutable_properties(self) -> set[str]:
            return {"forbidden"}

    async def main() -> None:
        lm = CachedCausalLM.from_pretrained(str(tiny_llama()), backend="hf")
        model = NoLetter(lm, "the weather is", "e")
        particles = await smc_standard(model, 4)
        prompt_len = len(lm.tokenizer.encode("the weather is"))
        for p in particles:
            assert not math.isnan(p.weight)
            if p.weight == -math.inf:
                continue
            new = p.context.tokens[prompt_len:]
            assert all("e" not in lm.vocab[t] for t in new if t != p.eos_token), new
        assert any(p.weight > -math.inf for p in particles)
        # the model's logprobs are the core's
        ids = lm.tokenizer.encode("the weather is")
        core = core_hf(tiny_llama())
        assert_tiny_close(
            await lm.next_token_logprobs(ids), core.next_token_logprobs_sync(ids), "llamppl's row"
        )
        core.close()

    asyncio.run(main())
