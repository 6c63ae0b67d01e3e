"""Workers in other processes: tensor parallel over the ``mp`` executor (TP=2) on the
tiny Llama, rows back through shared memory, checked against the single-process TP=1
engine (``tiny_backend``); then a worker killed mid-batch, and a clean slate after.

One TP=2 engine is shared by the module (the kill ends it: that test comes last),
plus one more TP=2 engine for "a new backend in the same process works".
vLLM's CPU tensor parallel needs one OpenMP thread list per rank
(``VLLM_CPU_OMP_THREADS_BIND``); set only while an engine starts, so the in-process
engines of the other modules keep their automatic binding.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import threading
import time

import psutil
import pytest
import torch
from oracles import max_abs_diff

import genlm_core
from conftest import TINY_BUDGET

# Two ranks, one core each: the layout of the 2-core CI machine (and of any box: a
# rank per core list). The in-process engines of other modules never see this.
BIND = "0|1" if (os.cpu_count() or 1) >= 2 else "0|0"


@contextlib.contextmanager
def _bind_env():
    old = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = BIND
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = old


def _load_tp2(path: str, **extra):
    with _bind_env():
        return genlm_core.load(
            "vllm",
            model=path,
            dtype="float32",
            enforce_eager=True,
            max_model_len=256,
            max_num_batched_tokens=TINY_BUDGET,
            batch_size=16,
            engine_opts={
                "block_size": 32,
                "tensor_parallel_size": 2,
                "distributed_executor_backend": "mp",
                "disable_log_stats": False,
                **extra,
            },
        )


def _ids(backend, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    pool = [i for i in range(len(backend.byte_vocab)) if i not in set(backend.eos_token_ids) and i > 2]
    return [rng.choice(pool) for _ in range(n)]


def _mixed_batch(backend) -> list[list[int]]:
    base = _ids(backend, 90, 0)
    return [
        base[:1],
        base[:7],
        _ids(backend, 23, 1),
        base[:40],
        base[:41],
        base[:7],  # repeated
        base[:90],  # alone larger than a step's budget: chunked prefill
        base[:40] + _ids(backend, 12, 3),
    ]


def _shm_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("genlm-vllm-")}


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture(scope="module")
def tp2(tiny_path):
    llm = _load_tp2(tiny_path)
    yield llm
    llm.close()


def test_tp2_layout_and_mixed_batch_match_tp1(tp2, tiny_backend) -> None:
    info = tp2.info()
    assert not tp2.in_process and info["tensor_parallel_size"] == 2 and info["world_size"] == 2
    assert info["distributed_executor_backend"] == "mp" and len(info["workers"]) == 2
    assert [w["tp_rank"] for w in info["workers"]] == [0, 1]
    assert all(w["pid"] != os.getpid() for w in info["workers"])  # the rows must travel
    batch = _mixed_batch(tp2)
    tp2.clear_cache()
    tiny_backend.clear_cache()
    before = dict(tp2.transport_counts)
    got = tp2.batch_next_token_logprobs_sync(batch)
    assert tp2.transport_counts["shm"] > before["shm"]  # through /dev/shm, not pickled bytes
    assert tp2.transport_counts["bytes"] == before["bytes"]
    want = tiny_backend.batch_next_token_logprobs_sync(batch)
    # TP=2 sums each matmul in two halves and all-reduces them: float32 reordering of
    # sums over hidden 64 (~1e-6 relative on logits of magnitude < 10) stays far below 1e-4
    for i in range(len(batch)):
        assert max_abs_diff(got[i], want[i]) <= 1e-4, i
    assert torch.equal(got[1], got[5])
    assert not torch.allclose(got[3], got[4])


async def test_tp2_async_callers_and_sampling(tp2, tiny_backend) -> None:
    ctxs = [_ids(tp2, n, 30 + n) for n in (3, 9, 14, 6, 20, 11)]
    tp2.clear_cache()
    rows = await asyncio.gather(*(tp2.next_token_logprobs(c) for c in ctxs))
    want = tiny_backend.batch_next_token_logprobs_sync(ctxs)
    for i, row in enumerate(rows):
        assert max_abs_diff(row, want[i]) <= 1e-4, i
    p = _ids(tp2, 5, 70)
    greedy = await tp2.sample(p, 4, eos_token_ids=[], temperature=0.0)
    ctx = list(p)
    for tok in greedy:  # greedy sampling follows the argmax of the captured rows
        assert tok == int(torch.argmax(tp2.next_token_logprobs_sync(ctx)))
        ctx.append(tok)
    a = await tp2.batch_sample([p, p, p], 4, eos_token_ids=[], seed=11)
    assert len(a) == 3 and all(len(s) == 4 for s in a)
    assert a[0] == await tp2.sample(p, 4, eos_token_ids=[], seed=11)
    assert a[2] == await tp2.sample(p, 4, eos_token_ids=[], seed=13)


def test_tp2_preempted_request_matches_tp1(tiny_path, tiny_backend) -> None:
    """6 KV blocks: long decodes next to the captured prompts force preemptions; the
    recomputed requests' rows still travel back right (through the backend's fetch)."""
    from genlm_vllm.capture import TAG_KEY
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    segments = _shm_segments()
    kids = _descendants()
    llm = _load_tp2(tiny_path, num_gpu_blocks_override=6, max_model_len=160)
    try:
        rng = random.Random(0)
        prompts, params, tags = [], [], []
        for i in range(8):
            if i % 2 == 0:
                p = [rng.randrange(3, 1000) for _ in range(10)]
                params.append(SamplingParams(max_tokens=80, ignore_eos=True, temperature=1.0))
            else:
                p = [rng.randrange(3, 1000) for _ in range(rng.randint(30, 100))]
                tags.append(f"{llm._namespace}:pre{i}")
                params.append(SamplingParams(max_tokens=1, temperature=0.0, extra_args={TAG_KEY: tags[-1]}))
            prompts.append(p)
        with llm.batcher.model_lock:
            llm.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
            rows, missing = llm._fetch(tags)
        assert not missing
        preemptions = sum(m.value for m in llm.llm.get_metrics() if m.name == "vllm:num_preemptions")
        assert preemptions > 0
        ours = [p for i, p in enumerate(prompts) if i % 2]
        want = tiny_backend.batch_next_token_logprobs_sync(ours)
        for row, ref in zip(rows, want):
            assert max_abs_diff(torch.log_softmax(row[: want.shape[1]].float(), -1), ref) <= 1e-4
    finally:
        llm.close()
    # nothing of that engine is left: worker processes, the shared-memory buffer
    assert _shm_segments() <= segments
    assert _descendants() <= kids


def test_killed_worker_fails_callers_then_clean_close_and_new_backend(tp2, tiny_path) -> None:
    """SIGKILL one rank while a batch runs: every caller (running and queued) gets a
    clear error within a bounded time, the backend says it is unhealthy, close()
    leaves no process or segment, and a new TP=2 backend in this process works."""
    from genlm_vllm.backend import EngineDiedError

    assert tp2.healthy
    segments_before = _shm_segments() - {tp2._buffer.name}
    kids_before = _descendants() - {w["pid"] for w in tp2.workers}
    victim = tp2.workers[1]["pid"]
    batch = [_ids(tp2, 200, 900 + k) for k in range(12)]  # ~75 steps of 32 tokens
    tp2.clear_cache()
    errors: list[BaseException] = []

    async def callers() -> None:
        async def one(ctx):
            try:
                await tp2.next_token_logprobs(ctx)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        tasks = [asyncio.create_task(one(c)) for c in batch]
        await asyncio.sleep(0.5)  # the first batch is running
        os.kill(victim, signal.SIGKILL)
        await asyncio.sleep(0.2)
        late = asyncio.create_task(one(_ids(tp2, 5, 1)))  # queued after the death
        await asyncio.gather(*tasks, late)

    t0 = time.monotonic()
    runner = threading.Thread(target=lambda: asyncio.run(callers()), daemon=True)
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive(), "callers still waiting 120 s after the worker was killed"
    elapsed = time.monotonic() - t0
    assert len(errors) == len(batch) + 1, (len(errors), elapsed)
    assert all(isinstance(e, RuntimeError) for e in errors), [type(e) for e in errors]
    assert any(isinstance(e, EngineDiedError) for e in errors)
    assert not tp2.healthy and tp2.info()["healthy"] is False
    with pytest.raises(EngineDiedError, match="died|failed"):
        tp2.next_token_logprobs_sync([5, 6, 7])
    tp2.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_descendants() - kids_before):
        time.sleep(0.5)
    assert not (_descendants() - kids_before)
    assert _shm_segments() <= segments_before

    fresh = _load_tp2(tiny_path)
    try:
        assert fresh.healthy
        row = fresh.next_token_logprobs_sync([5, 6, 7])
        assert torch.isfinite(row).any() and abs(float(torch.logsumexp(row, -1))) < 1e-4
    finally:
        fresh.close()
    assert _shm_segments() <= segments_before
