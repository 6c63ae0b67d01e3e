"""Workers in other processes, on the tiny Llama (float32), against the single-process
TP=1 engine of the session (``tiny_backend``):

* (a) ``tensor_parallel_size=2`` over the ``mp`` executor, the engine core in this
  process: one engine shared by the module, with 6 KV blocks so mixed batches are
  chunked *and* preempted; rows through ``/dev/shm``; the bytes fallback (off-node
  workers); a rank killed mid-batch (this test ends that engine, so it comes last but
  the ones below);
* (b) ``pipeline_parallel_size=2``: started after the kill, so it is also "a new
  backend in the same process works" and the no-leftovers check of a clean close;
* (c) ``distributed_executor_backend="ray"`` on a local Ray cluster the test starts
  and stops: vLLM's CPU platform refuses it (asserted with vLLM's own message); the
  code path Ray would use (rows from worker processes through ``collective_rpc``,
  shared memory on the node, bytes off it) is the one (a) and (d) exercise;
* (d) the multiprocessing engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=1``) with (a).

CPU ranks need their own core lists (``VLLM_CPU_OMP_THREADS_BIND``): the backend
splits this machine's cores between the ranks when the variable is unset.
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


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _load(path: str, **extra):
    return genlm_core.load(
        "vllm",
        model=path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=160,
        max_num_batched_tokens=TINY_BUDGET,
        batch_size=16,
        engine_opts={"block_size": 32, "disable_log_stats": False, **extra},
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
    """Live child processes, less multiprocessing's resource tracker (started by the
    first ``spawn`` of the process and kept for its lifetime: not an engine's)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline()):
                out.add(p.pid)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture(scope="module")
def tp2(tiny_path):
    """TP=2 over the mp executor; 6 KV blocks of 32 tokens: long decodes beside the
    captured prompts force preemptions."""
    llm = _load(
        tiny_path, tensor_parallel_size=2, distributed_executor_backend="mp", num_gpu_blocks_override=6
    )
    yield llm
    llm.close()


def _preemptions(llm) -> int:
    return int(sum(m.value for m in llm.llm.get_metrics() if m.name == "vllm:num_preemptions"))


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


def test_tp2_preempted_requests_and_bytes_fallback_match_tp1(tp2, tiny_backend) -> None:
    """Decodes beside captured prompts on 6 KV blocks: requests are preempted and
    recomputed, their rows still travel back right; then the same through the bytes
    path a worker takes when it cannot open the backend's buffer (another node)."""
    from genlm_vllm.capture import TAG_KEY
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = random.Random(0)
    prompts, params, tags = [], [], []
    for i in range(8):
        if i % 2 == 0:  # a decode that grows from 1 block to 3
            p = [rng.randrange(3, 1000) for _ in range(10)]
            params.append(SamplingParams(max_tokens=80, ignore_eos=True, temperature=1.0))
        else:
            p = [rng.randrange(3, 1000) for _ in range(rng.randint(30, 100))]
            tags.append(f"{tp2._namespace}:pre{i}")
            params.append(SamplingParams(max_tokens=1, temperature=0.0, extra_args={TAG_KEY: tags[-1]}))
        prompts.append(p)
    ours = [p for i, p in enumerate(prompts) if i % 2]
    want = tiny_backend.batch_next_token_logprobs_sync(ours)
    before = _preemptions(tp2)
    with tp2.batcher.model_lock:
        tp2.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        rows, missing = tp2._fetch(tags)
    assert not missing and _preemptions(tp2) > before
    for row, ref in zip(rows, want):
        assert max_abs_diff(torch.log_softmax(row[: want.shape[1]].float(), -1), ref) <= 1e-4

    # a buffer whose header the workers cannot recognise: what a worker on another
    # node sees (a /dev/shm of its own); rows come back as float32 bytes instead
    nonce = tp2._buffer.nonce
    tp2._buffer.nonce = bytes(len(nonce))
    try:
        shm, sent = tp2.transport_counts["shm"], tp2.transport_counts["bytes"]
        tp2.clear_cache()
        got = tp2.batch_next_token_logprobs_sync(ours)
        assert tp2.transport_counts["bytes"] > sent and tp2.transport_counts["shm"] == shm
    finally:
        tp2._buffer.nonce = nonce
    assert max_abs_diff(got, want) <= 1e-4


def test_mp_engine_core_with_tp2(tiny_path, tiny_backend) -> None:
    """(d): the engine core in its own process, its two ranks in two more; the rows
    still come through /dev/shm; close() leaves no process and no segment."""
    segments, kids = _shm_segments(), _descendants()
    with _env("VLLM_ENABLE_V1_MULTIPROCESSING", "1"):
        llm = _load(tiny_path, tensor_parallel_size=2, distributed_executor_backend="mp")
    try:
        info = llm.info()
        assert info["engine_core"] == "own process" and info["world_size"] == 2
        batch = _mixed_batch(llm)
        got = llm.batch_next_token_logprobs_sync(batch)
        assert llm.transport_counts["shm"] > 0 and llm.transport_counts["bytes"] == 0
        want = tiny_backend.batch_next_token_logprobs_sync(batch)
        assert max_abs_diff(got, want) <= 1e-4
        s = llm.sample_sync(batch[2], 3, eos_token_ids=[], temperature=0.0)
        assert s[0] == int(torch.argmax(got[2]))
    finally:
        llm.close()
    _assert_gone(kids, segments)


def _assert_gone(kids: set[int], segments: set[str], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and (_descendants() - kids):
        time.sleep(0.5)
    assert not (_descendants() - kids), [psutil.Process(p).cmdline()[:3] for p in _descendants() - kids]
    assert _shm_segments() <= segments, _shm_segments() - segments


def test_killed_worker_fails_callers_then_clean_close(tp2) -> None:
    """SIGKILL one rank while a batch runs: every caller (running and queued) gets a
    clear error within a bounded time, the backend says it is unhealthy, and close()
    leaves no process or segment behind."""
    from genlm_vllm.backend import EngineDiedError

    assert tp2.healthy
    segments_before = _shm_segments() - {tp2._buffer.name}
    kids_before = _descendants() - {w["pid"] for w in tp2.workers}
    victim = tp2.workers[1]["pid"]
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
        await asyncio.sleep(0.5)  # the first batch is running
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
    _assert_gone(kids_before, segments_before)


def test_pp2_after_the_kill_matches_tp1(tiny_path, tiny_backend) -> None:
    """(b), and a new multi-process backend in the process whose engine lost a worker."""
    segments, kids = _shm_segments(), _descendants()
    llm = _load(tiny_path, pipeline_parallel_size=2, distributed_executor_backend="mp")
    try:
        info = llm.info()
        assert info["pipeline_parallel_size"] == 2 and [w["pp_rank"] for w in info["workers"]] == [0, 1]
        assert [w["reply"] for w in info["workers"]] == [False, True]  # the last stage answers
        batch = _mixed_batch(llm)
        got = llm.batch_next_token_logprobs_sync(batch)
        want = tiny_backend.batch_next_token_logprobs_sync(batch)
        assert max_abs_diff(got, want) <= 1e-4
        assert llm.transport_counts["shm"] > 0
        s = asyncio.run(llm.batch_sample([batch[1], batch[2]], 3, eos_token_ids=[], temperature=0.0))
        assert [t[0] for t in s] == [int(torch.argmax(got[1])), int(torch.argmax(got[2]))]
    finally:
        llm.close()
    _assert_gone(kids, segments)


def test_ray_executor_is_refused_on_cpu(tiny_path) -> None:
    """(c): a local Ray cluster (loopback, 2 CPUs) started and stopped here; vLLM's CPU
    platform has no Ray device key and refuses the executor with its own error."""
    import ray  # scripts/setup_env.sh installs it: this test is never skipped

    kids = _descendants()
    # On a loaded 2-core box the raylet sometimes gives up waiting for its dashboard
    # agent (a crash in WaitForDashboardAgentPorts after ~15 s) and ray.init raises
    # "The current node timed out during startup": start it again (Ray's own state is
    # gone by then), at most three times.
    for attempt in range(3):
        try:
            with _env("RAY_agent_register_timeout_ms", "180000"):
                ray.init(
                    num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False
                )
            break
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception here
            ray.shutdown(wait_for_processes=True)
            # a failed ray.init leaves the processes it started (no node to shut down):
            # end them, by pid, before the next attempt
            procs = []
            for pid in _descendants() - kids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc = psutil.Process(pid)
                    proc.kill()
                    procs.append(proc)
            psutil.wait_procs(procs, timeout=10)
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
    try:
        assert ray.cluster_resources().get("CPU") == 2
        with pytest.raises(ValueError, match="current platform cpu does not support ray"):
            _load(tiny_path, distributed_executor_backend="ray")
        from ray._private.state import actors  # the GCS actor table (no dashboard needed)

        assert actors(actor_state_name="ALIVE") == {}  # no worker actor left behind
    finally:
        # wait: Ray's processes get SIGTERM and, without waiting, may outlive the check
        ray.shutdown(wait_for_processes=True)
    _assert_gone(kids, set(_shm_segments()))
