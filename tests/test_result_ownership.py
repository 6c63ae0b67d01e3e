"""Results nobody can corrupt, budgets that hold.

The contract: every tensor a backend returns belongs to its caller (SMC code masks
rows in place), on every path; cached rows own exactly their memory, so the output
cache's byte budget counts what it keeps alive; ``close()`` never hands a caller a
``CancelledError`` it did not ask for; an empty batch is a ``(0, vocab)`` tensor.
The oracle is always an independent computation: the uncached forward pass or a
copy taken before anybody touched anything.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import torch

import genlm_core
from genlm_core.bytes.testing import TableBackend
from genlm_core.engine.batching import AutoBatcher, BatcherClosed
from genlm_core.engine.caches import OutputCache, sizeof


def _mock(**options):
    return genlm_core.load("mock", **options)


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


# ---------------------------------------------------------------- callers own their rows
async def _get(llm, path: str, ctx: list[int]) -> torch.Tensor:
    if path == "sync":
        return llm.next_token_logprobs_sync(ctx)
    if path == "async":
        return await llm.next_token_logprobs(ctx)
    if path == "batch_sync":
        return llm.batch_next_token_logprobs_sync([ctx, [1]])[0]
    if path == "batch_async":
        return (await llm.batch_next_token_logprobs([[1], ctx]))[1]
    raise AssertionError(path)


PATHS = ["sync", "async", "batch_sync", "batch_async"]


@pytest.mark.parametrize("first", PATHS)
@pytest.mark.parametrize("second", PATHS)
async def test_editing_a_returned_row_changes_no_later_result(first, second):
    """The failure this guards against: ``a = lp([1, 2]); a.zero_()`` made every later ``lp([1, 2])`` zero.

    ``first`` fills the cache (miss), ``second`` reads it (hit); both rows are edited in
    place and a third call must still give the uncached forward pass, bit for bit.
    """
    llm = _mock(batch_size=4)
    ctx = [1, 2]
    truth = llm.next_token_logprobs_uncached(ctx)
    a = await _get(llm, first, ctx)  # miss: computed, cached
    a.zero_()
    b = await _get(llm, second, ctx)  # hit
    assert torch.equal(b, truth)
    b.fill_(float("nan"))
    for path in PATHS:
        assert torch.equal(await _get(llm, path, ctx), truth), path
    llm.close()


async def test_concurrent_callers_of_one_context_get_distinct_tensors():
    """Callers merged into one batch entry (same key) must not share a tensor."""
    llm = _mock(batch_size=16, timeout=0.01, cache_size=0)
    ctx = [5, 6, 7]
    truth = llm.next_token_logprobs_uncached(ctx)
    rows = await asyncio.gather(*(llm.next_token_logprobs(ctx) for _ in range(4)))
    assert llm.batcher.stats.deduplicated == 3  # they were merged
    assert len({r.untyped_storage().data_ptr() for r in rows}) == 4
    rows[0].zero_()
    for r in rows[1:]:
        assert torch.equal(r, truth)
    llm.close()


async def test_batcher_gives_each_merged_caller_its_own_array():
    """The AutoBatcher itself (async trie, byte masses): merged callers get copies."""
    b = AutoBatcher(lambda reqs: [np.full(3, r, dtype=np.float32) for r in reqs], timeout=0.01)
    got = await asyncio.gather(*(b.submit(7, key=7) for _ in range(3)))
    got[0][:] = -1
    assert [g.tolist() for g in got[1:]] == [[7.0] * 3] * 2
    b.close()


# ---------------------------------------------------------------- cached rows own their memory
def test_sizeof_counts_the_storage_a_view_keeps_alive():
    big = torch.zeros(32, 1000)
    assert sizeof(big[3]) == big.untyped_storage().nbytes() == 32 * 1000 * 4
    arr = np.zeros((32, 1000), dtype=np.float32)
    assert sizeof(arr[3]) == arr.nbytes
    assert sizeof((big[0], big[1])) == 32 * 1000 * 4  # one storage, counted once
    assert sizeof(torch.zeros(10)) == 40


def test_output_cache_keeps_private_compact_copies():
    cache = OutputCache(max_entries=None, max_bytes=None)
    batch = torch.arange(32 * 10, dtype=torch.float32).reshape(32, 10)
    cache.put((1,), batch[4])
    held = cache.get((1,))
    assert _storage_bytes(held) == 40 == cache.nbytes
    batch.zero_()  # the producer reuses its buffer
    assert held.tolist() == list(range(40, 50))


async def test_output_cache_budget_counts_real_storage_after_batches_of_32():
    """The failure this guards against: rows from batches of 32, one kept per batch, held 16.5x the budget."""
    V = _mock().vocab_size
    row = V * 4
    llm = _mock(batch_size=32, timeout=0.01, cache_bytes=4 * row)
    for batch_no in range(6):
        await asyncio.gather(*(llm.next_token_logprobs([batch_no + 1, i]) for i in range(32)))
    cache = llm.output_cache
    values = [cache._data[k][0] for k in cache.keys()]
    storages = {v.untyped_storage().data_ptr(): _storage_bytes(v) for v in values}
    assert sum(storages.values()) <= 4 * row  # what is really kept alive
    assert cache.nbytes == sum(storages.values())
    llm.close()


async def test_a_computed_batch_is_cached_as_one_block_the_callers_never_share():
    """The output cache adopts a batch's normalised rows (one block, no copy per row):
    the budget counts the block once, and no caller's row is a view of it."""
    llm = _mock(batch_size=32, timeout=0.01)
    V = llm.vocab_size
    ctxs = [[3, i] for i in range(32)]
    truth = [llm.next_token_logprobs_uncached(c) for c in ctxs]
    rows = await asyncio.gather(*(llm.next_token_logprobs(c) for c in ctxs))
    assert llm.batcher.stats.batches == 1
    cache = llm.output_cache
    held = [cache._data[tuple(c)][0] for c in ctxs]
    assert len({v.untyped_storage().data_ptr() for v in held}) == 1  # one block
    assert cache.nbytes == _storage_bytes(held[0]) == 32 * V * 4
    blocks = {held[0].untyped_storage().data_ptr()}
    assert all(r.untyped_storage().data_ptr() not in blocks and _storage_bytes(r) == r.nbytes for r in rows)
    for r in rows:
        r.fill_(float("nan"))  # the callers scribble on their rows
    for c, t in zip(ctxs, truth):
        assert torch.equal(await llm.next_token_logprobs(c), t)  # hits, untouched
    llm.close()


async def test_returned_rows_do_not_keep_the_batch_alive():
    llm = _mock(batch_size=32, timeout=0.01, cache_size=0)
    rows = await asyncio.gather(*(llm.next_token_logprobs([9, i]) for i in range(32)))
    assert all(_storage_bytes(r) == r.nbytes for r in rows)
    llm.close()


# ---------------------------------------------------------------- close() mid-batch
async def test_close_while_a_batch_runs_gives_no_caller_a_cancelled_error():
    """The running batch's callers get their results (the batch completes); queued: BatcherClosed."""
    started, release = threading.Event(), threading.Event()

    def fn(reqs):
        started.set()
        release.wait(5)
        return [r * 10 for r in reqs]

    b = AutoBatcher(fn, batch_size=8, timeout=0.0)
    tasks = [asyncio.ensure_future(b.submit(i)) for i in range(20)]
    while not started.is_set():
        await asyncio.sleep(0.001)
    threading.Timer(0.05, release.set).start()
    b.close()  # from the loop's own thread, while the batch runs in the worker thread
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert results[:8] == [i * 10 for i in range(8)]
    assert all(isinstance(r, BatcherClosed) for r in results[8:]), results[8:]
    with pytest.raises(BatcherClosed):
        await b.submit(1)


async def test_close_from_another_thread_while_a_batch_runs():
    started = threading.Event()

    def fn(reqs):
        started.set()
        time.sleep(0.05)
        return [r + 1 for r in reqs]

    b = AutoBatcher(fn, batch_size=4, timeout=0.0)
    tasks = [asyncio.ensure_future(b.submit(i)) for i in range(10)]
    while not started.is_set():
        await asyncio.sleep(0.001)
    await asyncio.to_thread(b.close)
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert results[:4] == [1, 2, 3, 4]
    assert all(isinstance(r, BatcherClosed) for r in results[4:]), results[4:]


async def test_backend_close_mid_batch():
    """The same on a backend: start 20 calls, ``llm.close()`` while a batch runs."""
    reference = _mock()  # same distributions (seeded by the context), no delay
    truth = {i: reference.next_token_logprobs_uncached([i + 1]) for i in range(20)}
    llm = _mock(batch_size=8, timeout=0.0, work_s=0.05, cache_size=0)
    tasks = [asyncio.ensure_future(llm.next_token_logprobs([i + 1])) for i in range(20)]
    while llm.batcher.stats.batches == 0:
        await asyncio.sleep(0.001)
    llm.close()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert not any(isinstance(r, asyncio.CancelledError) for r in results), results
    done = [i for i, r in enumerate(results) if isinstance(r, torch.Tensor)]
    assert done == list(range(8))  # the running batch
    for i in done:
        assert torch.equal(results[i], truth[i])
    assert all(isinstance(results[i], BatcherClosed) for i in range(8, 20))


async def test_reset_mid_batch_delivers_the_running_batch_and_keeps_serving():
    started = threading.Event()

    def fn(reqs):
        started.set()
        time.sleep(0.03)
        return [-r for r in reqs]

    b = AutoBatcher(fn, batch_size=2, timeout=0.0)
    tasks = [asyncio.ensure_future(b.submit(i)) for i in range(5)]
    while not started.is_set():
        await asyncio.sleep(0.001)
    b.reset()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert results[:2] == [0, -1]
    assert all(isinstance(r, BatcherClosed) for r in results[2:])
    assert await asyncio.wait_for(b.submit(9), 5) == -9
    b.close()


# ---------------------------------------------------------------- empty batches
@pytest.mark.parametrize(
    "make", [lambda: _mock(), lambda: TableBackend([b"a", b"b", b"<e>"], eos_token_ids=[2])]
)
async def test_empty_batch_is_an_empty_float32_tensor(make):
    llm = make()
    for out in (llm.batch_next_token_logprobs_sync([]), await llm.batch_next_token_logprobs([])):
        assert out.shape == (0, llm.vocab_size) and out.dtype == torch.float32
    llm.close()
