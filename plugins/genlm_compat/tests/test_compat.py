"""genlm-compat: the documented examples of genlm-backend (README, docs) and genlm-bytes
run against genlm.backend / genlm.bytes, with results equal to genlm-core's own API."""

from __future__ import annotations

import asyncio
import importlib.metadata
import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch

import genlm_core
from genlm_core.bytes import BeamParams as CoreBeamParams
from genlm_core.bytes import ByteBeamState as CoreByteBeamState
from genlm_core.engine.vocab import decode_vocab as core_decode_vocab
from genlm_core.testing.tolerance import row_atol, row_magnitude, tiny_shape
from genlm_core.token import Token as CoreToken

gb = pytest.importorskip("genlm.backend")
gbytes = pytest.importorskip("genlm.bytes")

# float32 logits of one model recomputed in a batch of another shape (padding, KV reuse):
# the sums reorder; each row is held to the bound derived from that arithmetic
# (genlm_core.testing.tolerance) for the tiny model and the row's magnitude.


@pytest.fixture(scope="module")
def tiny_path() -> str:
    from genlm_core.testing import models as model_paths

    return str(model_paths.tiny_llama())


def test_namespace_portions_and_one_token_class() -> None:
    import genlm

    assert not hasattr(genlm, "__file__") or genlm.__file__ is None  # PEP 420 namespace, no __init__
    from genlm.backend.tokenization import Token

    assert Token is CoreToken is gb.Token


def test_readme_sis_example(tiny_path: str) -> None:
    """genlm-backend's README program (autobatched SIS with a byte-vocabulary mask);
    every particle's weight is recomputed from the core backend's logprobs."""
    llm = gb.load_model_by_name(tiny_path, backend="hf", llm_opts={"hf_opts": {"torch_dtype": "float"}})
    eos_id = llm.tokenizer.eos_token_id
    valid = torch.tensor(
        [i == eos_id or len(t) <= 3 for i, t in enumerate(llm.byte_vocab)], dtype=torch.float
    ).log()
    eos_one_hot = torch.nn.functional.one_hot(torch.tensor(eos_id), len(llm.byte_vocab)).log()

    def mask(context: list[int]) -> torch.Tensor:
        return eos_one_hot if len(context) >= 6 else valid

    class Particle:
        def __init__(self, prompt_ids: list[int]) -> None:
            self.context: list[int] = []
            self.prompt_ids = prompt_ids
            self.log_weight = 0.0
            self.active = True

        async def extend(self) -> None:
            logps = await llm.next_token_logprobs(self.prompt_ids + self.context)
            masked = logps + mask(self.context).to(logps.device)
            logZ = masked.logsumexp(dim=-1)
            self.log_weight += float(logZ)
            nxt = torch.multinomial((masked - logZ).exp(), 1).item()
            if nxt == eos_id:
                self.active = False
            else:
                self.context.append(nxt)

    async def sis(prompt_ids: list[int]) -> list[Particle]:
        particles = [Particle(prompt_ids) for _ in range(5)]
        while any(p.active for p in particles):
            await asyncio.gather(*[p.extend() for p in particles if p.active])
        return particles

    torch.manual_seed(0)
    prompt_ids = llm.tokenizer.encode("Montreal is")
    particles = asyncio.run(sis(prompt_ids))
    core = genlm_core.load("hf", model=tiny_path, dtype="float32", device="cpu")
    for p in particles:
        want, bound = 0.0, 0.0
        for t in range(len(p.context) + 1):
            ctx = p.context[:t]
            row = core.next_token_logprobs_sync(prompt_ids + ctx)
            lp = row + mask(ctx)
            want += float(lp.logsumexp(dim=-1))
            # a logsumexp of entries each within the row's bound is within it too
            bound += row_atol(tiny_shape(), row_magnitude(row))
        assert p.log_weight == pytest.approx(want, abs=bound)
    core.close()
    llm.close()


def test_decode_vocab(tiny_path: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    byte_vocab, str_vocab = gb.decode_vocab(tok)
    core_bytes, _ = core_decode_vocab(tok)
    assert byte_vocab == core_bytes and all(type(t) is CoreToken for t in byte_vocab)
    assert byte_vocab[10].byte_string == bytes(core_bytes[10])
    for t, s in zip(byte_vocab, str_vocab):
        try:
            assert s == bytes(t).decode("utf-8")
        except UnicodeDecodeError:
            assert s == tok.convert_ids_to_tokens(t.token_id)
    _, latin = gb.decode_vocab(tok, byte2str_fallback="latin1")
    assert all(s == bytes(t).decode("utf-8", errors="ignore") or s == bytes(t).decode("latin1")
               for t, s in zip(byte_vocab, latin))  # fmt: skip
    with pytest.raises(ValueError, match="Unknown byte2str_fallback strategy: nope"):
        gb.decode_vocab(tok, byte2str_fallback="nope")


def test_trie_readme_example_and_async_restart() -> None:
    """genlm-backend's trie example; masses against a brute-force prefix sum."""
    decode = [b"cat", b"cats", b"dog", b"dogs"]
    p = [0.4, 0.1, 0.3, 0.2]
    for trie in (gb.TokenCharacterTrie(decode=decode), gb.ParallelTokenCharacterTrie(decode, device="cpu")):
        mass = trie.mass_sum(p_llm=p)
        assert isinstance(mass, np.ndarray) and len(mass) == len(trie.children) == 13
        assert trie.root == len(trie.children) - 1  # genlm-backend numbers nodes in post-order
        for node in range(len(trie.children)):
            pre = bytes(trie.node2prefix[node])
            if node in trie.leaf2word:  # a leaf: its token's weight alone
                want = p[decode.index(trie.leaf2word[node])]
            else:
                want = sum(w for w, t in zip(p, decode) if t.startswith(pre))
            # the parallel trie sums float32 weights in float32: at most V=1024 terms, so
            # 4 sqrt(V) u relative (probabilistic bound, u = 2^-24)
            assert mass[node] == pytest.approx(want, rel=4 * math.sqrt(len(p)) * 2**-24)
        assert not hasattr(trie, "eos_node")  # genlm-backend's tries have no EOS node

    async def main() -> None:
        at = gb.AsyncTokenCharacterTrie(gb.TokenCharacterTrie(decode))
        first = await at.weight_sum(np.array(p))
        await at.cleanup()
        again = await at.weight_sum(np.array(p))  # genlm-backend restarts after cleanup
        np.testing.assert_array_equal(first, again)
        await at.cleanup()

    asyncio.run(main())


def test_beam_params_positional_and_eos_meaning() -> None:
    bp = gbytes.BeamParams(4, 0.01, False, [b"<e>"], False, 2, 1)
    assert (bp.K, bp.prune_threshold, bp.verbose, bp.eos_tokens, bp.heal) == (
        4,
        0.01,
        False,
        (b"<e>",),
        False,
    )
    assert (bp.heal_max_backoff, bp.heal_max_splits) == (2, 1)
    assert gbytes.BeamParams(K=3).eos_tokens == ()  # genlm-bytes: None means no EOS tokens
    # a set, as in genlm-bytes
    assert gbytes.BeamParams(K=3, eos_byte_strings=[b"x"]).eos_byte_strings == {b"x"}
    with pytest.raises(TypeError, match="multiple values"):
        gbytes.BeamParams(3, K=4)
    with pytest.raises(TypeError, match="'K'"):
        gbytes.BeamParams()
    with pytest.raises(ValueError):
        gbytes.BeamParams(K=0)


def test_byte_beam_equals_the_core(tiny_path: str) -> None:
    """genlm-bytes' usage (initial, prefill, <<, logp_next) on a mock LM, equal to the core."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)

    async def run(llm: Any, beam: Any) -> tuple[float, np.ndarray]:
        beam = await beam.prefill(b"the cat")
        for b in b" sat":
            beam = await (beam.prune() << b)
        dist = await beam.logp_next()
        out = (beam.logZ, np.asarray(dist.ps))
        await beam.cleanup()
        return out

    async def main() -> None:
        compat_llm = gb.MockAsyncLM(tok)
        eos = bytes(compat_llm.byte_vocab[tok.eos_token_id])
        got = await run(
            compat_llm,
            await gbytes.ByteBeamState.initial(compat_llm, gbytes.BeamParams(5, 0.0, False, [eos])),
        )
        core_llm = genlm_core.load("mock", model=tiny_path)
        want = await run(
            core_llm, await CoreByteBeamState.initial(core_llm, CoreBeamParams(K=5, eos_tokens=[eos]))
        )
        assert got[0] == want[0]  # same mechanism, same inputs: bit-identical
        np.testing.assert_array_equal(got[1], want[1])
        with pytest.raises(ValueError, match="atomic_byte_strings"):
            await gbytes.ByteBeamState.initial(
                compat_llm, gbytes.BeamParams(5), {"atomic_byte_strings": [b"a"]}
            )
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            await gbytes.ByteBeamState.initial(compat_llm, gbytes.BeamParams(5), {"bogus": 1})

    asyncio.run(main())


def test_byte_beam_greedy_and_sample_take_genlm_bytes_arguments(tiny_path: str) -> None:
    """genlm-bytes' ``greedy(context, steps)`` and ``sample(context, steps, draw=)``, keywords
    too, against a hand loop over the core's beam (prefill, logp_next, prune, <<)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    context, steps = b"the cat", 5

    def key(i: int) -> Any:
        return None if i == 256 else i

    async def by_hand(beam: Any, choose: Any) -> bytes:
        out = bytearray(context)
        beam = await beam.prefill(context)
        for _ in range(steps):
            b = key(choose(np.asarray((await beam.logp_next()).ps)))
            if b is None or b == 257:
                break
            beam = await (beam.prune() << b)
            out.append(b)
        return bytes(out)

    def second(ps: np.ndarray) -> int:  # the second likeliest entry: a draw no sampler makes by chance
        return int(np.argsort(-ps, kind="stable")[1])

    async def main() -> None:
        llm = gb.MockAsyncLM(tok)
        eos = bytes(llm.byte_vocab[tok.eos_token_id])
        beam = await gbytes.ByteBeamState.initial(llm, gbytes.BeamParams(5, 0.0, False, [eos]))
        core = await CoreByteBeamState.initial(llm, CoreBeamParams(K=5, eos_tokens=[eos]))
        greedy = await beam.greedy(context, steps=steps)
        assert greedy == await beam.greedy(context, steps) == await by_hand(core, np.argmax)
        assert len(greedy) <= len(context) + steps

        def draw(chart: Any) -> Any:  # genlm-bytes hands draw a Chart of probabilities
            assert math.isclose(sum(chart.values()), 1.0, rel_tol=1e-6)
            return chart.argmax()

        def second_of(chart: Any) -> Any:
            ps = np.array([chart[b] for b in range(256)] + [chart[None], chart[257]])
            return key(second(ps))

        assert await beam.sample(context, steps, draw=second_of) == await by_hand(core, second)
        assert await beam.sample(context, steps, draw) == greedy  # positional, as genlm-bytes'
        np.random.seed(3)
        drawn = await beam.sample(context, steps=steps)
        np.random.seed(3)
        assert await beam.sample(context, steps) == drawn  # numpy's global generator
        assert drawn.startswith(context)
        with pytest.raises(ValueError, match="must be a non-negative int"):
            await beam.greedy(context, steps=-1)
        await beam.cleanup()

    asyncio.run(main())


def test_llm_constructors_map_options(tiny_path: str) -> None:
    llm = gb.AsyncTransformer.from_name(
        tiny_path, hf_opts={"torch_dtype": "float", "low_cpu_mem_usage": True}
    )
    assert llm.config.dtype == "float32" and llm.config.hf_opts == {"low_cpu_mem_usage": True}
    assert next(llm.model.parameters()).dtype == torch.float32
    again = gb.AsyncTransformer(llm.model, llm.tokenizer, batch_size=3, timeout=0.01)
    assert (again.config.batch_size, again.config.timeout) == (3, 0.01)
    ids = llm.tokenizer.encode("hello there")
    np.testing.assert_array_equal(again.next_token_logprobs_sync(ids), llm.next_token_logprobs_sync(ids))
    with pytest.raises(ValueError, match="unknown LoRA adapter: 'nope'"):
        llm.next_token_logprobs_sync(ids, lora_name="nope")
    with pytest.raises(ValueError, match="torch_dtype"):
        gb.AsyncTransformer.from_name(tiny_path, hf_opts={"torch_dtype": "int8"})
    with pytest.raises(ValueError, match="Invalid backend: nope"):
        gb.load_model_by_name(tiny_path, backend="nope")
    mock = gb.load_model_by_name(tiny_path, backend="mock")
    core_mock = genlm_core.load("mock", model=tiny_path)
    assert isinstance(mock, gb.MockAsyncLM)
    np.testing.assert_array_equal(mock.next_token_logprobs_sync(ids), core_mock.next_token_logprobs_sync(ids))
    for x in (llm, again, mock, core_mock):
        x.close()


def test_warns_next_to_the_real_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    from genlm.backend import _guard

    real = importlib.metadata.version

    def fake(dist: str) -> str:
        return "0.3.1" if dist == "genlm-backend" else real(dist)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _guard.warn_if_real("genlm-backend", "genlm.backend")  # not installed: silent
    monkeypatch.setattr(importlib.metadata, "version", fake)
    with pytest.warns(
        _guard.CompatShadowWarning, match="genlm-backend 0.3.1 is installed next to genlm-compat"
    ):
        _guard.warn_if_real("genlm-backend", "genlm.backend")


@pytest.mark.parametrize("eos", ["<|endoftext|>", b"<|endoftext|>"])
def test_beam_params_one_eos_string_is_one_token_not_its_characters(eos: Any) -> None:
    """``eos_tokens="<|endoftext|>"`` once made 13 one-byte EOS tokens (every 'e' ended a
    sequence); ``b"</s>"`` was refused. Both are one token, as in genlm-core."""
    assert gbytes.BeamParams(K=5, eos_tokens=eos).eos_tokens == (b"<|endoftext|>",)
    assert gbytes.BeamParams(5, 0.0, False, eos).eos_byte_strings == {b"<|endoftext|>"}
    assert gbytes.BeamParams(K=5, eos_tokens=[eos, b"</s>"]).eos_tokens == (b"<|endoftext|>", b"</s>")


def test_load_model_by_name_refuses_a_name_that_is_not_a_name() -> None:
    with pytest.raises(TypeError, match="hub id or a local folder .* got int 123"):
        gb.load_model_by_name(123, backend="mock")


def test_mock_options_are_checked_before_the_tokenizer_is_loaded(tmp_path: Any) -> None:
    """An unknown option is reported as such (not after the hub's retries for the tokenizer)."""
    with pytest.raises(ValueError, match="Unknown option 'llm_opts'"):
        gb.MockAsyncLM.from_name("gpt2", llm_opts={"bogus": 1})
    with pytest.raises(ValueError, match="Unknown option 'bogus'"):
        gb.load_model_by_name("gpt2", backend="mock", llm_opts={"bogus": 1})
    with pytest.raises(ValueError, match="does not exist"):
        gb.MockAsyncLM.from_name(str(tmp_path / "missing"))


def test_stateful_lm_and_trie_start_take_genlm_bytes_calls(tiny_path: str) -> None:
    """``StatefulTokenizedLM(model, context, n_calls, max_context_length)`` positionally,
    as genlm-bytes', its states extended as their own class; ``start()`` on the async
    trie, then its masses equal the trie's own."""
    llm = genlm_core.load("mock", model=tiny_path)
    state = gbytes.StatefulTokenizedLM(llm, [5, 6, 7], 0, 3)
    assert state.context == (5, 6, 7) and state.max_context_length == 3
    nxt = state << 8
    assert type(nxt) is gbytes.StatefulTokenizedLM and nxt.context == (6, 7, 8)
    assert gbytes.StatefulTokenizedLM(llm, [1, 2], n_calls=4).context == (1, 2)
    vocab = [b"a", b"ab", b"b"]
    trie = gbytes.AsyncTokenByteTrie.from_vocab(vocab)
    ws = np.array([0.5, 0.25, 0.25])

    async def main() -> Any:
        trie.start()
        return await trie.weight_sum(ws)

    np.testing.assert_array_equal(asyncio.run(main()), trie.trie.weight_sum(ws))
    char_trie = gb.AsyncTokenCharacterTrie.from_vocab(vocab)
    char_trie.start()
    np.testing.assert_array_equal(asyncio.run(char_trie.weight_sum(ws)), char_trie.trie.weight_sum(ws))


def test_a_model_of_ones_own_subclasses_async_lm(tiny_path: str) -> None:
    """genlm-backend's ``AsyncLM`` subclassed (a tokenizer, the two row methods): its batch
    calls stack its rows and its samplers draw genlm-backend 0.3.1's tokens for a seed
    (that release's loop, written out below); every genlm-core backend is an AsyncLM."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)

    class Table(gb.AsyncLM):  # a model of one's own: a fixed row for each context's sum mod 8
        def __init__(self, tokenizer: Any) -> None:
            super().__init__(tokenizer)
            g = torch.Generator().manual_seed(0)
            self.rows = torch.log_softmax(torch.randn(8, len(self.byte_vocab), generator=g) * 4, dim=-1)

        async def next_token_logprobs(self, token_ids: Any, lora_name: Any = None) -> torch.Tensor:
            return self.next_token_logprobs_sync(token_ids)

        def next_token_logprobs_sync(self, token_ids: Any, lora_name: Any = None) -> torch.Tensor:
            return self.rows[sum(token_ids) % 8].clone()

    lm = Table(tok)
    assert lm.byte_vocab == gb.decode_vocab(tok)[0] and lm.tokenizer is tok
    contexts = [[1, 2], [3], [4, 5, 6]]
    want = torch.stack([lm.rows[sum(c) % 8] for c in contexts])
    assert torch.equal(lm.batch_next_token_logprobs_sync(contexts), want)
    assert torch.equal(asyncio.run(lm.batch_next_token_logprobs(contexts)), want)

    def by_hand(prompt: list[int], n: int, eos: list[int], temperature: float, seed: int) -> list[int]:
        gen = torch.Generator()
        gen.manual_seed(seed)
        out: list[int] = []
        for _ in range(n):
            probs = torch.softmax(lm.next_token_logprobs_sync(prompt + out) / temperature, dim=-1)
            token = torch.multinomial(probs, num_samples=1, generator=gen).item()
            if token in eos:
                break
            out.append(token)
        return out

    eos = [int(lm.rows[0].argsort()[-3])]  # a likely token: some draws stop on it
    for seed, temperature in [(0, 1.0), (1, 0.7), (2, 1.5), (3, 1.0)]:
        got = asyncio.run(lm.sample([1, 2], 12, eos, temperature=temperature, seed=seed))
        assert got == by_hand([1, 2], 12, eos, temperature, seed)
    batch = asyncio.run(lm.batch_sample(contexts, 6, eos, seed=5))
    assert batch == [by_hand(c, 6, eos, 1.0, 5) for c in contexts]
    assert asyncio.run(lm.sample([1], 0, eos)) == []
    with pytest.raises(TypeError, match="abstract"):

        class Half(gb.AsyncLM):
            async def next_token_logprobs(self, token_ids: Any, lora_name: Any = None) -> Any:
                return None

        Half(tok)  # type: ignore[abstract]
    with pytest.raises(RuntimeError, match=r"set_lora\(\) was removed"):
        lm.set_lora("a", "b")
    with pytest.raises(NotImplementedError, match="cannot load LoRA adapters"):
        lm.add_new_lora("a", "b")
    mock = genlm_core.load("mock", model=tiny_path)
    assert isinstance(mock, gb.AsyncLM) and issubclass(gb.AsyncTransformer, gb.AsyncLM)
    mock.close()
