"""The remote backend against `genlm serve mock`: the conformance kit on both transports,
rows equal bit for bit to the mock's own (computed in this process: the oracle),
sampling equal to the served backend's, the tokenizer delegated."""

from __future__ import annotations

import asyncio

import pytest
import torch

import genlm_core
from genlm_core.serve.testing import ServerProcess
from genlm_core.testing import LogprobBackendConformance


@pytest.fixture(scope="module")
def server():
    with ServerProcess("mock", opts={"max_context_length": 64}) as srv:
        yield srv


@pytest.fixture(scope="module")
def oracle():
    llm = genlm_core.load("mock", max_context_length=64)
    yield llm
    llm.close()


class TestRemoteMockShm(LogprobBackendConformance):
    atol = 0.0  # the same bytes: the server's rows are copied, never recomputed

    @pytest.fixture(scope="class")
    def backend(self, server):
        llm = genlm_core.load("remote", url=server.url, transport="shm")
        yield llm
        llm.close()


class TestRemoteMockFrame(LogprobBackendConformance):
    atol = 0.0

    @pytest.fixture(scope="class")
    def backend(self, server):
        llm = genlm_core.load("remote", url=server.url, transport="frame", batch_size=3, cache_size=0)
        yield llm
        llm.close()


@pytest.mark.parametrize("transport", ["shm", "frame"])
def test_rows_are_the_served_backends_bit_for_bit(server, oracle, transport) -> None:
    llm = genlm_core.load("remote", url=server.url, transport=transport)
    try:
        assert llm.byte_vocab == oracle.byte_vocab and llm.str_vocab == oracle.str_vocab
        assert llm.eos_token_ids == oracle.eos_token_ids and llm.dtype == oracle.dtype == "float32"
        assert llm.max_context_length == 64
        ctxs = [[1, 2, 3], [7], [300, 5, 6, 9], [1, 2, 3]]
        got = llm.batch_next_token_logprobs_sync(ctxs)
        want = oracle.batch_next_token_logprobs_sync(ctxs)
        assert torch.equal(got, want)
        assert torch.equal(
            llm.next_token_logprobs_uncached([4, 4]), oracle.next_token_logprobs_uncached([4, 4])
        )
        assert llm.stats()["transport"]["replies"][transport] > 0
    finally:
        llm.close()


def test_the_default_url_form_picks_shm_on_loopback(server, oracle) -> None:
    """load("remote", url="http://127.0.0.1:PORT") as a user writes it: same host, so
    rows come through a segment the server handed this client; nothing is created in
    /dev/shm, and the server drops the segment once the client closes."""
    import os
    import time

    llm = genlm_core.load("remote", url=server.url)
    probe = genlm_core.load("remote", url=server.url, transport="frame")
    try:
        assert llm.engine.transport == "shm" and llm.info()["shm_segments"] == 1, llm.info()
        assert torch.equal(llm.next_token_logprobs_sync([1, 2]), oracle.next_token_logprobs_sync([1, 2]))
        assert llm.stats()["transport"]["replies"] == {"shm": 1, "frame": 0}
        held = probe.engine.server_stats()["shm"]["segments"]
        assert held >= 1
        assert [n for n in os.listdir("/dev/shm") if n.startswith(f"genlm-remote-{os.getpid()}-")] == []
        llm.close()
        deadline = time.monotonic() + 60  # the server notices the closed socket on its loop
        while probe.engine.server_stats()["shm"]["segments"] != held - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert probe.engine.server_stats()["shm"]["segments"] == held - 1
    finally:
        llm.close()
        probe.close()


def test_sampling_is_the_served_backends(server, oracle) -> None:
    llm = genlm_core.load("remote", url=server.url)

    async def both():
        a = await llm.sample([5, 6], max_tokens=8, eos_token_ids=[], seed=3)
        b = await oracle.sample([5, 6], max_tokens=8, eos_token_ids=[], seed=3)
        c = await llm.batch_sample([[1], [2, 3]], max_tokens=4, eos_token_ids=[], seed=9)
        d = await oracle.batch_sample([[1], [2, 3]], max_tokens=4, eos_token_ids=[], seed=9)
        return a, b, c, d

    try:
        a, b, c, d = asyncio.run(both())
        assert a == b and len(a) == 8 and c == d
    finally:
        llm.close()


def test_tokenizer_is_the_servers(server, oracle) -> None:
    llm = genlm_core.load("remote", url=server.url)
    try:
        text = "hello world, the apple"
        ids = llm.tokenizer.encode(text)
        assert ids == oracle.tokenizer.encode(text)
        assert llm.tokenizer.decode(ids) == text
        assert llm.tokenizer.eos_token_id == oracle.tokenizer.eos_token_id
        assert len(llm.tokenizer) == len(oracle.tokenizer)
    finally:
        llm.close()


@pytest.mark.parametrize("gather_ms", [0, 300])
def test_many_clients_share_forward_passes(gather_ms) -> None:
    """Rows asked by several clients at once are batched together on the server: with
    a forward pass that takes 50 ms, requests arriving meanwhile queue, and the next
    batch holds more rows than any one request carries (2). With gathering on
    (genlm_core.serve.gather), four clients in lockstep share nearly every batch (8
    rows); without, they fall into two groups a step. Each client gets its own rows
    (oracle: the mock in this process)."""
    from concurrent.futures import ThreadPoolExecutor

    oracle = genlm_core.load("mock")
    with ServerProcess("mock", opts={"work_s": 0.05}, args=["--gather-ms", str(gather_ms)]) as srv:
        clients = [genlm_core.load("remote", url=srv.url, cache_size=0) for _ in range(4)]
        # every step new contexts: the server's output cache answers none of them
        ctxs = [[[[c, i, 11 + step] for i in range(2)] for step in range(6)] for c in range(4)]

        def ask(k: int):
            return [clients[k].batch_next_token_logprobs_sync(ctxs[k][step]) for step in range(6)]

        try:
            with ThreadPoolExecutor(4) as pool:
                results = list(pool.map(ask, range(4)))
            for k in range(4):
                for step in range(6):
                    assert torch.equal(results[k][step], oracle.batch_next_token_logprobs_sync(ctxs[k][step]))
            stats = clients[0].engine.server_stats()
            assert stats["requests"]["logprobs"] == 24 and stats["batch_sizes"]["recent"] <= 24
            assert stats["batch_sizes"]["max"] > 2, stats["batch_sizes"]
            assert stats["queue_depth"] == 0 and "output_cache" in stats["cache_hit_rate"]
            if gather_ms:
                # 24 requests of 2 rows: 6 batches of 8 when every step is shared; the
                # first step may split while the clients' first requests straggle in
                assert stats["batch_sizes"]["mean"] >= 6, stats["batch_sizes"]
                assert stats["gather"]["held_requests"] > 0
        finally:
            for c in clients:
                c.close()
            oracle.close()


def test_clear_cache_is_local_clear_server_cache_is_the_servers(server, oracle) -> None:
    llm = genlm_core.load("remote", url=server.url)
    try:
        llm.engine.clear_server_cache()
        llm.next_token_logprobs_sync([42, 43])
        assert llm.engine.server_stats()["backend"]["output_cache"]["entries"] >= 1
        llm.clear_cache()  # this client's own cache only
        assert llm.output_cache.stats()["entries"] == 0
        assert llm.engine.server_stats()["backend"]["output_cache"]["entries"] >= 1
        llm.engine.clear_server_cache()
        assert llm.engine.server_stats()["backend"]["output_cache"]["entries"] == 0
        assert torch.equal(llm.next_token_logprobs_sync([42, 43]), oracle.next_token_logprobs_sync([42, 43]))
    finally:
        llm.close()


def test_the_client_imports_no_engine_and_no_server_stack(server) -> None:
    """A fresh process loads the remote backend, gets rows and encodes text without
    importing any engine, tokenizer library or the server's web stack."""
    import subprocess
    import sys

    code = (
        "import sys, genlm_core\n"
        f"llm = genlm_core.load('remote', url={server.url!r})\n"
        "llm.next_token_logprobs_sync(llm.tokenizer.encode('hello world'))\n"
        "llm.close()\n"
        "heavy = ('transformers', 'tokenizers', 'vllm', 'llama_cpp', 'mlx', 'starlette', 'uvicorn', 'ray')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
