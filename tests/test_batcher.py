"""AutoBatcher: batching, de-duplication, failures reaching every caller, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

import genlm_core
from genlm_core.engine.batching import AutoBatcher, BatcherClosed


def square_batches(record: list[list[int]] | None = None, fail_on: set[int] | None = None):
    calls = {"n": 0}

    def fn(reqs: list[int]) -> list[int]:
        calls["n"] += 1
        if record is not None:
            record.append(list(reqs))
        if fail_on and calls["n"] in fail_on:
            raise RuntimeError(f"batch {calls['n']} failed")
        return [r * r for r in reqs]

    return fn, calls


async def test_batches_respect_size_and_results_match():
    record: list[list[int]] = []
    fn, _ = square_batches(record)
    b = AutoBatcher(fn, batch_size=8, timeout=0.01)
    out = await asyncio.gather(*(b.submit(i) for i in range(50)))
    assert out == [i * i for i in range(50)]
    assert all(len(x) <= 8 for x in record)
    assert sum(len(x) for x in record) == 50
    assert b.stats.batches == len(record) and b.stats.max_batch_size == 8
    b.close()


async def test_identical_keys_computed_once():
    record: list[list[int]] = []
    fn, _ = square_batches(record)
    b = AutoBatcher(fn, batch_size=64, timeout=0.01)
    out = await asyncio.gather(*(b.submit(i % 5, key=i % 5) for i in range(40)))
    assert out == [(i % 5) ** 2 for i in range(40)]
    assert sum(len(x) for x in record) == 5
    assert b.stats.deduplicated == 35
    b.close()


async def test_failing_third_batch_reaches_all_callers_and_fourth_succeeds():
    fn, calls = square_batches(fail_on={3})
    b = AutoBatcher(fn, batch_size=4, timeout=0.001)
    results = []
    for batch_no in range(1, 5):
        res = await asyncio.wait_for(
            asyncio.gather(*(b.submit(batch_no * 10 + i) for i in range(4)), return_exceptions=True), 5
        )
        results.append(res)
    assert calls["n"] == 4
    assert all(isinstance(r, RuntimeError) and "batch 3" in str(r) for r in results[2])
    assert results[3] == [(40 + i) ** 2 for i in range(4)]
    assert results[0] == [(10 + i) ** 2 for i in range(4)]
    b.close()


async def test_per_request_exception_fails_only_that_caller():
    def fn(reqs):
        return [ValueError("odd") if r % 2 else r for r in reqs]

    b = AutoBatcher(fn, batch_size=16, timeout=0.005)
    res = await asyncio.gather(*(b.submit(i) for i in range(6)), return_exceptions=True)
    assert [r for r in res if not isinstance(r, Exception)] == [0, 2, 4]
    assert all(isinstance(res[i], ValueError) for i in (1, 3, 5))
    b.close()


async def test_batch_of_50_with_cancelled_caller_and_bad_input():
    llm = genlm_core.load("mock", batch_size=64, timeout=0.05, cache_size=0)
    rng = torch.Generator().manual_seed(0)
    contexts = [
        torch.randint(0, llm.vocab_size, (int(n),), generator=rng).tolist()
        for n in torch.randint(1, 12, (50,), generator=rng)
    ]
    contexts[17] = [-3]  # bad input
    expected = {i: llm.next_token_logprobs_uncached(c) for i, c in enumerate(contexts) if i != 17}
    tasks = [asyncio.ensure_future(llm.next_token_logprobs(c)) for c in contexts]
    await asyncio.sleep(0)
    tasks[31].cancel()  # cancelled while waiting for its batch
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[17], ValueError)
    assert isinstance(results[31], asyncio.CancelledError)
    ok = [i for i in range(50) if i not in (17, 31)]
    assert len(ok) == 48
    for i in ok:
        assert torch.equal(results[i], expected[i])
    assert llm.batcher.stats.batches == 1  # all 48 (+cancelled dropped) in one batch
    assert llm.batcher.pending_count() == 0
    llm.close()


async def test_cancelled_caller_does_not_use_a_slot():
    record: list[list[int]] = []
    fn, _ = square_batches(record)
    b = AutoBatcher(fn, batch_size=4, timeout=0.02)
    tasks = [asyncio.ensure_future(b.submit(i)) for i in range(4)]
    await asyncio.sleep(0)
    tasks[0].cancel()
    more = [asyncio.ensure_future(b.submit(i)) for i in range(4, 6)]
    await asyncio.gather(*tasks[1:], *more)
    assert 0 not in [r for batch in record for r in batch]
    b.close()


async def test_ten_thousand_concurrent_requests_on_mock():
    llm = genlm_core.load("mock", batch_size=128, timeout=0.001, cache_size=0)
    rng = torch.Generator().manual_seed(1)
    contexts = [tuple(torch.randint(0, 50, (3,), generator=rng).tolist()) for _ in range(10_000)]
    results = await asyncio.gather(*(llm.next_token_logprobs(c) for c in contexts))
    assert len(results) == 10_000
    assert max(llm.batcher.stats.batch_sizes) <= 128
    distinct = {}
    for c, r in zip(contexts, results):
        if c not in distinct:
            distinct[c] = r
            assert torch.equal(r, torch.log_softmax(torch.from_numpy(llm.logits_for(c)), -1))
        else:
            assert torch.equal(distinct[c], r)
    llm.close()


async def test_model_call_runs_off_the_event_loop():
    loop_thread = threading.get_ident()
    seen = []

    def fn(reqs):
        seen.append(threading.get_ident())
        time.sleep(0.05)
        return reqs

    b = AutoBatcher(fn, batch_size=4, timeout=0.0)
    ticks = 0

    async def ticker():
        nonlocal ticks
        for _ in range(20):
            await asyncio.sleep(0.002)
            ticks += 1

    await asyncio.gather(b.submit(1), ticker())
    assert seen and seen[0] != loop_thread
    assert ticks >= 10  # the loop kept running while the batch ran
    b.close()


async def test_one_model_call_at_a_time():
    active, peak = 0, 0
    lock = threading.Lock()

    def fn(reqs):
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.01)
        with lock:
            active -= 1
        return reqs

    b = AutoBatcher(fn, batch_size=2, timeout=0.0)
    sync_thread = threading.Thread(target=lambda: [b.run_sync([i]) for i in range(5)])
    sync_thread.start()
    await asyncio.gather(*(b.submit(i) for i in range(12)))
    sync_thread.join()
    assert peak == 1
    b.close()


async def test_close_fails_waiting_callers():
    def fn(reqs):
        return reqs

    # a deadline keeps the lone request waiting (the default tick policy would run it)
    b = AutoBatcher(fn, batch_size=100, timeout=10.0, policy="deadline")
    task = asyncio.ensure_future(b.submit(1))
    await asyncio.sleep(0.01)
    b.close()
    with pytest.raises(BatcherClosed):
        await asyncio.wait_for(task, 2)
    with pytest.raises(BatcherClosed):
        await b.submit(2)


async def test_reset_then_keeps_serving():
    b = AutoBatcher(lambda r: r, batch_size=100, timeout=10.0, policy="deadline")  # keeps it waiting
    task = asyncio.ensure_future(b.submit(1))
    await asyncio.sleep(0.01)
    b.reset()
    with pytest.raises(BatcherClosed):
        await asyncio.wait_for(task, 2)
    b.timeout = 0.001
    assert await asyncio.wait_for(b.submit(5), 2) == 5
    b.close()


@pytest.mark.parametrize("policy", ["deadline", "tick", "debounce"])
async def test_timeout_policies_flush_partial_batches(policy):
    record: list[list[int]] = []
    fn, _ = square_batches(record)
    b = AutoBatcher(fn, batch_size=1000, timeout=0.01, policy=policy)
    out = await asyncio.wait_for(asyncio.gather(*(b.submit(i) for i in range(7))), 2)
    assert out == [i * i for i in range(7)] and record == [list(range(7))]
    b.close()


async def test_deadline_bounds_latency_under_a_trickle():
    """A steady trickle never lets a debounce fire; the deadline policy still runs batches."""
    record: list[list[int]] = []
    fn, _ = square_batches(record)
    b = AutoBatcher(fn, batch_size=1000, timeout=0.02, policy="deadline")
    first = asyncio.ensure_future(b.submit(0))
    t0 = time.perf_counter()
    for i in range(1, 30):
        await asyncio.sleep(0.005)
        asyncio.ensure_future(b.submit(i))
        if first.done():
            break
    await asyncio.wait_for(first, 2)
    assert time.perf_counter() - t0 < 0.1
    b.close()


def test_sync_path_and_reset_async_queries_compat():
    llm = genlm_core.load("mock")
    a = llm.next_token_logprobs_sync([1, 2, 3])
    llm.reset_async_queries()
    assert torch.equal(a, llm.next_token_logprobs_sync([1, 2, 3]))
    llm.close()


def test_batcher_usable_from_successive_event_loops():
    b = AutoBatcher(lambda r: [x + 1 for x in r], batch_size=4, timeout=0.001)
    for _ in range(3):
        assert asyncio.run(b.submit(1)) == 2
    b.close()


# ---------------------------------------------------------------- the tick policy
# A large timeout (0.5 s) makes these tests insensitive to machine speed: the policy
# either waits for the deadline (a whole 0.5 s per batch) or it does not.
@pytest.mark.parametrize("in_thread", [False, True])
async def test_tick_policy_runs_one_batch_for_submitters_of_one_tick(in_thread):
    record: list[list[int]] = []
    fn, _ = square_batches(record)
    b = AutoBatcher(fn, batch_size=64, timeout=0.5, policy="tick", run_in_thread=in_thread)
    t0 = time.perf_counter()
    out = await asyncio.wait_for(asyncio.gather(*(b.submit(i) for i in range(20))), 5)
    assert out == [i * i for i in range(20)]
    assert record == [list(range(20))]  # one batch, as with the deadline
    assert time.perf_counter() - t0 < 0.25  # and without waiting for it
    b.close()


async def test_tick_policy_does_not_delay_a_sequential_caller():
    fn, calls = square_batches()
    b = AutoBatcher(fn, batch_size=64, timeout=0.5, policy="tick")
    t0 = time.perf_counter()
    for i in range(10):
        assert await asyncio.wait_for(b.submit(i), 5) == i * i
    # the deadline policy takes 10 x 0.5 s here; the tick policy less than one timeout
    assert time.perf_counter() - t0 < 0.5
    assert calls["n"] == 10
    b.close()


async def test_tick_policy_keeps_pipelined_particles_in_full_batches():
    """Particles that await one batcher, then another (trie, then model), with CPU work
    on the loop in between, resume together and fill every batch of both batchers."""
    first: list[list[int]] = []
    second: list[list[int]] = []
    fa, _ = square_batches(first)
    fb, _ = square_batches(second)
    a = AutoBatcher(fa, batch_size=64, timeout=0.5, policy="tick", run_in_thread=True)
    b = AutoBatcher(fb, batch_size=64, timeout=0.5, policy="tick", run_in_thread=False)

    async def particle(i: int) -> None:
        for step in range(5):
            x = await a.submit(i * 100 + step)
            end = time.perf_counter() + 0.0002 * (i % 3)  # CPU work that blocks the loop
            while time.perf_counter() < end:
                pass
            await b.submit(x)

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(particle(i) for i in range(16))), 10)
    assert [len(x) for x in first] == [16] * 5
    assert [len(x) for x in second] == [16] * 5
    assert time.perf_counter() - t0 < 0.5  # no batch waited for its deadline
    a.close()
    b.close()


async def test_tick_policy_batches_sis_like_the_deadline():
    """SIS on the mock backend: each step's particles form one batch under both policies."""
    from genlm_core.tools.sis import run_sis

    sizes = {}
    for policy, timeout in (("deadline", 0.01), ("tick", 0.5)):
        llm = genlm_core.load("mock", batch_size=64, cache_size=0)
        llm.batcher.policy, llm.batcher.timeout = policy, timeout
        t0 = time.perf_counter()
        res = await asyncio.wait_for(run_sis(llm, "hello", n_particles=12, max_tokens=6, seed=3), 20)
        if policy == "tick":
            assert time.perf_counter() - t0 < 0.5 * res.forward_passes / 2
        sizes[policy] = (list(llm.batcher.stats.batch_sizes), res.texts)
        llm.close()
    assert sizes["tick"] == sizes["deadline"]  # same batches, same samples


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="policy must be one of 'deadline', 'tick', 'debounce', got 'soon'"):
        AutoBatcher(lambda r: r, policy="soon")


async def test_tick_policy_is_bounded_on_a_loop_kept_busy():
    """Another task is always ready (it never submits): the lone request still runs after
    about ``timeout``, not when the busy task stops (1 s later)."""
    fn, _ = square_batches()
    b = AutoBatcher(fn, batch_size=64, timeout=0.05, policy="tick", run_in_thread=False)
    stop = time.perf_counter() + 1.0

    async def busy() -> None:
        while time.perf_counter() < stop:
            await asyncio.sleep(0)

    spinner = asyncio.ensure_future(busy())
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    assert await asyncio.wait_for(b.submit(3), 5) == 9
    assert time.perf_counter() - t0 < 0.5
    await spinner
    b.close()


# ---------------------------------------------------------------------- batch_policy option
async def test_backend_batch_policy_tick_serves_lone_callers_without_the_deadline():
    """``batch_policy="tick"`` reaches the backend's batcher: with a 0.5 s timeout, ten
    sequential calls finish well inside one timeout (under "deadline" each would wait
    for it), 16 concurrent calls still form one batch, and rows equal the deadline
    backend's (same mock model: bitwise)."""
    tick = genlm_core.load("mock", batch_policy="tick", timeout=0.5, cache_size=0)
    ref = genlm_core.load("mock", batch_policy="deadline", timeout=0.0, cache_size=0)
    assert tick.batcher.policy == "tick" and ref.batcher.policy == "deadline"
    assert genlm_core.load("mock").batcher.policy == "tick"  # the default
    t0 = time.perf_counter()
    for t in range(10):
        row = await tick.next_token_logprobs([1, 2, t])
        assert torch.equal(row, ref.next_token_logprobs_sync([1, 2, t]))
    assert time.perf_counter() - t0 < 0.5  # ten deadline waits would take >= 5 s
    before = tick.batcher.stats.batches
    rows = await asyncio.gather(*(tick.next_token_logprobs([3, t]) for t in range(16)))
    assert tick.batcher.stats.batches - before == 1
    for t, row in enumerate(rows):
        assert torch.equal(row, ref.next_token_logprobs_sync([3, t]))
    tick.close()
    ref.close()


def test_info_and_health_follow_close() -> None:
    llm = genlm_core.load("mock")
    info = llm.info()
    assert info["backend"] == "mock" and info["vocab_size"] == llm.vocab_size and info["healthy"]
    assert llm.healthy
    llm.close()
    assert not llm.healthy and llm.info()["healthy"] is False
