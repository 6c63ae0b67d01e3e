"""Property test: random interleavings of submit / cancel / close / reset / failing batches.

Whatever the interleaving, no caller hangs (every await is bounded), every caller gets
its result, equal to the unbatched function, or a clear error that the scenario
explains (its request failed, its batch failed, the batcher was closed or reset after
it submitted), and ``CancelledError`` only reaches callers that were cancelled.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from genlm_core.engine.batching import AutoBatcher, BatcherClosed


def f(v: int) -> np.ndarray:
    """The unbatched function (an array, so shared results would be visible)."""
    return np.array([v, v * v], dtype=np.int64)


def is_bad_request(v: int) -> bool:  # batch_fn returns an exception for this request only
    return v % 7 == 3


def is_poison(v: int) -> bool:  # batch_fn raises for the whole batch holding it
    return v % 11 == 5


ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 30), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 100), st.just(False)),
        st.tuples(st.just("sleep"), st.sampled_from([0, 0, 1, 3]), st.just(False)),
        st.tuples(st.sampled_from(["close", "reset", "reset_from_thread"]), st.just(0), st.just(False)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    script=ops,
    batch_size=st.integers(1, 6),
    timeout=st.sampled_from([0.0, 0.001, 0.003]),
    policy=st.sampled_from(["deadline", "tick", "debounce"]),
    run_in_thread=st.booleans(),
    work_ms=st.sampled_from([0, 0, 1, 2]),
)
def test_random_interleavings_never_hang_and_explain_every_outcome(
    script, batch_size, timeout, policy, run_in_thread, work_ms
):
    asyncio.run(_scenario(script, batch_size, timeout, policy, run_in_thread, work_ms))


async def _scenario(script, batch_size, timeout, policy, run_in_thread, work_ms) -> None:
    batches: list[tuple[list[int], bool]] = []

    def batch_fn(requests: list[int]) -> list[object]:
        if work_ms:
            time.sleep(work_ms / 1000)
        failed = any(is_poison(v) for v in requests)
        batches.append((list(requests), failed))
        if failed:
            raise RuntimeError("batch failed")
        return [ValueError(f"bad request {v}") if is_bad_request(v) else f(v) for v in requests]

    b = AutoBatcher(
        batch_fn, batch_size=batch_size, timeout=timeout, policy=policy, run_in_thread=run_in_thread
    )
    tasks: list[asyncio.Task] = []
    values: list[int] = []
    cancelled: set[int] = set()
    stops: list[int] = []  # number of submits made before each close/reset
    closed_at: int | None = None  # submits made before the first close
    for op, arg, keyed in script:
        if op == "submit":
            values.append(arg)
            tasks.append(asyncio.ensure_future(b.submit(arg, key=arg if keyed else None)))
        elif op == "cancel" and tasks:
            i = arg % len(tasks)
            if tasks[i].cancel():
                cancelled.add(i)
        elif op == "sleep":
            await asyncio.sleep(arg / 1000)
        elif op == "close":
            stops.append(len(tasks))
            closed_at = len(tasks) if closed_at is None else closed_at
            b.close()
        elif op == "reset":
            stops.append(len(tasks))
            b.reset()
        elif op == "reset_from_thread":
            stops.append(len(tasks))
            await asyncio.to_thread(b.reset)
    try:
        outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    except TimeoutError:
        raise AssertionError(f"callers hung: {[i for i, t in enumerate(tasks) if not t.done()]}") from None
    b.close()
    assert b.pending_count() == 0

    ok_batches = [set(reqs) for reqs, failed in batches if not failed]
    failed_batches = [set(reqs) for reqs, failed in batches if failed]
    for i, (v, out) in enumerate(zip(values, outcomes)):
        if i in cancelled:
            assert isinstance(out, asyncio.CancelledError), (i, v, out)
            continue
        assert not isinstance(out, asyncio.CancelledError), f"caller {i} was never cancelled but got {out!r}"
        if closed_at is not None and i >= closed_at:  # submitted after close
            assert isinstance(out, BatcherClosed), (i, v, out)
            continue
        if isinstance(out, np.ndarray):
            assert not is_bad_request(v) and any(v in s for s in ok_batches)
            assert np.array_equal(out, f(v)), (v, out)
        elif isinstance(out, ValueError):
            assert is_bad_request(v) and str(out) == f"bad request {v}"
        elif isinstance(out, BatcherClosed):
            assert any(n > i for n in stops), f"caller {i} got {out!r} with no close/reset after it"
        elif isinstance(out, RuntimeError) and str(out) == "batch failed":
            assert any(v in s for s in failed_batches)
        else:
            raise AssertionError(f"caller {i} ({v}) got an unexplained {out!r}")
    # callers merged on one key each own their array
    arrays = [out for out in outcomes if isinstance(out, np.ndarray)]
    assert len({id(a) for a in arrays}) == len(arrays)
    assert not any(np.shares_memory(a, c) for j, a in enumerate(arrays) for c in arrays[j + 1 :])
