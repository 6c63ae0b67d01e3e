"""One event loop per step (sync wrappers, CLIs, notebooks run ``asyncio.run`` per call):
once a step's loop is closed, nothing of it may stay alive in the batcher."""

from __future__ import annotations

import asyncio
import gc
import os
import time
import weakref

import numpy as np

from genlm_core.engine.batching import AutoBatcher

ROW = 50_000  # float32 values per result: 200 KB, the size of a real vocabulary row


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rows(reqs: list[int]) -> list[np.ndarray]:
    return [np.full(ROW, r, dtype=np.float32) for r in reqs]


def _live(refs: list[weakref.ref]) -> int:
    """Referents still alive, once the worker thread has let go of its last task (it may
    hold it for a moment after delivering): a leak stays past the 10 s."""
    deadline = time.monotonic() + 10.0
    while True:
        gc.collect()
        live = sum(r() is not None for r in refs)
        if live == 0 or time.monotonic() > deadline:
            return live
        time.sleep(0.05)


def test_a_thousand_event_loops_leave_nothing_alive():
    batcher = AutoBatcher(_rows, batch_size=16)
    loops: list[weakref.ref] = []

    async def step(i: int) -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        out = await asyncio.gather(*(batcher.submit(16 * i + k, key=16 * i + k) for k in range(16)))
        assert [int(o[0]) for o in out] == [16 * i + k for k in range(16)]

    for i in range(50):
        asyncio.run(step(i))
    # every closed loop is gone (before the fix each stayed alive with its last batch)
    assert _live(loops) == 0
    assert not batcher._states
    rss_start = _rss_bytes()
    for i in range(50, 1000):
        asyncio.run(step(i))
    grown = _rss_bytes() - rss_start
    assert _live(loops) == 0
    # 950 steps x 16 rows of 200 KB is 3 GB if a row per call stays alive; what may grow
    # legitimately (allocator pools, the batch-size counters) is well under 32 MB
    assert grown < 32 << 20, f"RSS grew by {grown / 2**20:.1f} MB over 950 event loops"
    assert batcher.stats.batches == 1000 and batcher.stats.computed == 16_000
    batcher.close()


def test_a_loop_closed_without_ending_the_worker_is_forgotten():
    """``loop.close()`` with the worker still waiting (no ``asyncio.run`` clean-up): the next
    use of the batcher drops that loop's state."""
    batcher = AutoBatcher(_rows, batch_size=4)
    loop = asyncio.new_event_loop()
    assert int(loop.run_until_complete(batcher.submit(3))[0]) == 3
    loop.close()  # the worker task is still pending on it
    ref = weakref.ref(loop)
    del loop
    assert int(asyncio.run(batcher.submit(5))[0]) == 5
    assert _live([ref]) == 0
    batcher.close()
