"""The remote backend against real engines served by `genlm serve`: transformers (tiny
Llama, float32) and llama.cpp (the tiny Llama's f32 GGUF). The conformance kit runs on
the client; the oracle for the rows is the same engine loaded in this process
(uncached single-context passes: the same float32 arithmetic in both processes, so the
bytes agree), and a genlm-control program (genlm-compat's PromptedLLM) runs unchanged
against the served model."""

from __future__ import annotations

import asyncio
import math
import re

import pytest
import torch
from model_paths import tiny_llama

import genlm_core
from genlm_core.serve.testing import ServerProcess
from genlm_core.testing import LogprobBackendConformance
from genlm_core.testing.tolerance import assert_backend_close

# batched vs single rows on the server: float32 sums in another order, held to the bound
# derived from that arithmetic (genlm_core.testing.tolerance); the wire adds nothing
CTXS = [[5, 6, 7], [100], [11, 12, 13, 14, 15]]


def _tiny_gguf() -> str:
    from genlm_llamacpp.convert import tiny_gguf_path

    return str(tiny_gguf_path("llama", "f32"))


HF = {"model": lambda: str(tiny_llama()), "opts": {"dtype": "float32", "device": "cpu"}}
LLAMACPP = {"model": _tiny_gguf, "opts": {"kv_cache_type": "f32", "n_threads": 2}}
# the server's hf engine with the decode step on (on CUDA it is on by default): the clients'
# calls of one token a row run as decode steps over its KV pool (genlm_hf.step)
HF_STATIC = {"engine": "hf", "model": HF["model"], "opts": {**HF["opts"], "static_decode": "on"}}
ENGINES = {"hf": HF, "hf-static": HF_STATIC, "llamacpp": LLAMACPP}


@pytest.fixture(scope="module", params=sorted(ENGINES))
def served(request):
    """(engine name, model, options, server) for each engine."""
    spec = ENGINES[request.param]
    engine = spec.get("engine", request.param)
    model = spec["model"]()
    with ServerProcess(engine, model=model, opts=spec["opts"]) as srv:
        yield engine, model, spec["opts"], srv


class TestRemoteEngineConformance(LogprobBackendConformance):
    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, served):
        llm = genlm_core.load("remote", url=served[3].url)
        yield llm
        llm.close()


def test_rows_tokenizer_and_identity_are_the_engines(served) -> None:
    name, model, opts, srv = served
    local = genlm_core.load(name, model=model, **opts)
    remote = genlm_core.load("remote", url=srv.url)
    try:
        assert remote.byte_vocab == local.byte_vocab and remote.str_vocab == local.str_vocab
        assert remote.eos_token_ids == local.eos_token_ids and remote.dtype == local.dtype == "float32"
        assert remote.max_context_length == local.max_context_length
        for ctx in CTXS:
            # one full pass per context on each side: the same arithmetic, the same bytes
            assert torch.equal(
                remote.next_token_logprobs_uncached(ctx), local.next_token_logprobs_uncached(ctx)
            )
        batch = remote.batch_next_token_logprobs_sync(CTXS)
        ref = torch.stack([local.next_token_logprobs_uncached(c) for c in CTXS])
        assert_backend_close(local, batch, ref, "served batch against local single passes")
        # particles a token a step (and two forked from one): served rows continue in place
        # where the engine keeps them (hf-static)
        ctxs = [list(c) for c in CTXS]
        for step in range(8):
            ctxs = [c + [20 + step + k] for k, c in enumerate(ctxs)]
            if step == 4:
                ctxs.append(ctxs[0][:-1] + [99])
            got = remote.batch_next_token_logprobs_sync(ctxs)
            ref = torch.stack([local.next_token_logprobs_uncached(c) for c in ctxs])
            assert_backend_close(local, got, ref, f"served step {step} against local single passes")
        text = "The cat sat on the mat."
        assert remote.tokenizer.encode(text) == local.tokenizer.encode(text)
        ids = local.tokenizer.encode(text, add_special_tokens=False)
        assert remote.tokenizer.encode(text, add_special_tokens=False) == ids
        assert remote.tokenizer.decode(ids) == local.tokenizer.decode(ids)
        assert remote.tokenizer.eos_token_id == local.tokenizer.eos_token_id
    finally:
        remote.close()
        local.close()


def test_a_genlm_control_program_runs_against_the_server(served) -> None:
    """genlm-control's eager set sampler + SMC over a regex, with PromptedLLM built on the
    remote backend (the only change from a local program is the load line). Oracle:
    every finished sequence matches the regex (Python's re), weights are never NaN."""
    pytest.importorskip("genlm.control", reason="genlm-control is installed by scripts/setup_env.sh")
    from genlm.backend import load_model_by_name
    from genlm.control import EOS, BoolFSA, PromptedLLM, eager_token_sampler

    pattern = r"(cat|dog) (sat|ran)"
    # genlm-backend's loader, backend "remote" (genlm-compat): the program's only change
    remote = load_model_by_name(served[1], backend="remote", llm_opts={"url": served[3].url})

    async def main():
        llm = PromptedLLM(remote)
        llm.set_prompt_from_str("Animals:")
        sampler = eager_token_sampler(llm, BoolFSA.from_regex(pattern))
        torch.manual_seed(0)
        seqs = await sampler.smc(n_particles=4, ess_threshold=0.5, max_tokens=10)
        await sampler.cleanup()
        return seqs

    try:
        seqs = asyncio.run(main())
    finally:
        remote.close()
    finite = 0
    for ctx, lw in zip(seqs.contexts, seqs.log_weights):
        assert not math.isnan(lw)
        if lw == -math.inf:
            continue
        finite += 1
        assert ctx and ctx[-1] == EOS
        text = b"".join(bytes(t) for t in ctx[:-1]).decode("utf-8", errors="replace")
        assert re.fullmatch(pattern, text), text
    assert finite > 0
