"""vLLM behind `genlm serve` (CPU, tiny Llama, float32): the remote backend passes the
conformance kit against it, its rows match the session's in-process engine on the same
model, and a genlm-control program runs against the server through genlm-compat.

The server is a subprocess with its own engine (same options as the session's
``tiny_backend``); its start is waited for with a generous limit (an engine start takes
minutes on a busy 2-core machine)."""

from __future__ import annotations

import asyncio
import math
import re

import pytest
import torch

import genlm_core
from genlm_core.serve.testing import ServerProcess
from genlm_core.testing import LogprobBackendConformance
from genlm_core.testing.tolerance import assert_tiny_close

OPTS = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 256,
    "max_num_batched_tokens": 32,
    "batch_size": 16,
    "engine_opts": {"block_size": 32},
}


@pytest.fixture(scope="module")
def vllm_server(tiny_path):
    with ServerProcess("vllm", model=tiny_path, opts=OPTS, ready_timeout=1200) as srv:
        yield srv


class TestServedVLLMConformance(LogprobBackendConformance):
    # the kit's derived bound: float32 rows of one model computed by two engines (the
    # server's and the session's) in different batch shapes and chunkings
    n_contexts = 8
    max_len = 40

    @pytest.fixture(scope="class")
    def backend(self, vllm_server):
        llm = genlm_core.load("remote", url=vllm_server.url)
        yield llm
        llm.close()


def test_served_rows_match_the_in_process_engine(vllm_server, tiny_backend) -> None:
    remote = genlm_core.load("remote", url=vllm_server.url)
    try:
        assert remote.byte_vocab == tiny_backend.byte_vocab and remote.dtype == tiny_backend.dtype
        assert remote.eos_token_ids == tiny_backend.eos_token_ids
        ctxs = [[5, 6, 7], [100], list(range(20, 60))]
        got = remote.batch_next_token_logprobs_sync(ctxs)
        want = torch.stack([tiny_backend.next_token_logprobs_uncached(c) for c in ctxs])
        assert_tiny_close(got, want, "served rows against the in-process engine")
        assert remote.stats()["transport"]["replies"]["shm"] > 0  # same host: /dev/shm
    finally:
        remote.close()


def test_a_genlm_control_program_runs_against_served_vllm(vllm_server, tiny_path) -> None:
    from genlm.backend import load_model_by_name
    from genlm.control import EOS, BoolFSA, PromptedLLM, eager_token_sampler

    pattern = r"(cat|dog) (sat|ran)"
    remote = load_model_by_name(tiny_path, backend="remote", llm_opts={"url": vllm_server.url})

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
        assert re.fullmatch(pattern, b"".join(bytes(t) for t in ctx[:-1]).decode("utf-8", errors="replace"))
    assert finite > 0
