"""The one auto-batcher every backend (and the async trie) uses.

Kept in one module: it is one class, :class:`AutoBatcher`, with its exception, its
counters and two private helpers (a waiting request, the per-event-loop queue and
worker state). Its public calls, its worker task, the tick-policy settling, the batch
run and delivery, and reset/close all act on the same per-loop state and the same
callers' futures, and the guarantees listed below (one result or one exception for
every caller, a running batch always delivered, no caller left waiting when a worker,
a loop or the batcher stops) hold only because of how these methods interleave on one
event loop: they are checked by reading them together, not one file at a time.

Callers ``await batcher.submit(request, key=...)``. Concurrent requests are gathered
and handed, as a list, to a synchronous ``batch_fn`` that runs in a worker thread,
so the event loop (and the particles' own CPU work) keeps running during the
forward pass.

Timer policy: **tick** (the default). A batch runs as soon as it holds ``batch_size``
distinct requests, or as soon as every task that was ready on the event loop has
submitted: the worker yields to the loop and runs the batch once nothing but other
gathering batchers is ready to run (particles resumed together, by ``asyncio.gather``
or by one batch's results, all submit before that), or once a loop iteration brought
no new request after ``timeout`` (a loop kept busy by work that does not submit). A
lone sequential caller then waits a loop iteration or two instead of ``timeout``.
Requests that arrive from other threads (or from tasks waiting on a thread) while the
loop is idle are not waited for, and may land in separate, smaller batches where a
timer would have gathered them.

Measured (``benchmarks/bench_batcher.py``, ``bench_sis.py``; quiet 2-core machine):
the same batches as the deadline policy on a bursty SMC-like workload (32 particles,
same wall time) and on the 16-particle SIS (18 forward passes a run, equal calls/s
within process-to-process noise), while a sequential caller pays ~0.17 ms of loop
overhead per call instead of the 1-2 ms timeout (5-9x faster per call).

``policy="deadline"``: a batch runs ``timeout`` seconds after the *oldest* waiting
request arrived (or when full). It bounds every caller's extra latency by ``timeout``
and gathers requests from other threads too. ``policy="debounce"``: ``timeout`` after
the *last* request; a steady trickle can postpone it indefinitely. While a batch is
running, new requests queue; when the model call returns, the next batch starts at
once if it is full or its policy says so.

Guarantees:

* requests with the same ``key`` that wait together are computed once and every
  caller gets the result (keys are whole contexts: never a suffix);
* if ``batch_fn`` raises, every caller of that batch receives the exception and the
  batcher keeps serving later requests; ``batch_fn`` may also return an
  ``Exception`` instance in place of one result to fail that request only;
* a caller cancelled while waiting is dropped from its batch (if no other caller
  shares its key) and never receives a result; its slot is not leaked;
* every caller owns what it gets: when several callers share a key, the first gets
  the result and each further one a private copy (``copy_result``, default
  :func:`genlm_core.engine.memory.private_copy`: tensors cloned, arrays copied), so a
  caller that edits its result in place changes nobody else's;
* :meth:`~AutoBatcher.close` and :meth:`~AutoBatcher.reset` fail every *queued*
  caller with :class:`BatcherClosed`; a batch already handed to ``batch_fn``
  completes and its callers get its results. No caller ever gets
  ``CancelledError`` unless it was itself cancelled (a worker stopped some other
  way, e.g. its event loop shutting down, fails its callers with ``BatcherClosed``);
* at most ``max_concurrency`` model calls run at a time (default 1), shared with the
  synchronous path through :attr:`~AutoBatcher.lock` (a backend passes its engine lock,
  so every batcher of the backend and its other engine calls take turns).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from genlm_core import _deprecated
from genlm_core.engine.memory import private_copy

Req = TypeVar("Req")
Res = TypeVar("Res")

__all__ = ["AutoBatcher", "BatcherClosed", "BatcherStats", "POLICIES"]


class BatcherClosed(RuntimeError):
    """Raised to callers still queued when the batcher is closed or reset (and to
    ``submit`` after ``close``)."""


@dataclass
class BatcherStats:
    """Counters that benchmarks and users can read (times in seconds)."""

    submitted: int = 0
    computed: int = 0
    deduplicated: int = 0
    batches: int = 0
    failed_batches: int = 0
    cancelled: int = 0
    queue_wait: float = 0.0
    model_time: float = 0.0
    max_batch_size: int = 0
    batch_sizes: list[int] = field(default_factory=list, repr=False)

    @property
    def mean_batch_size(self) -> float:
        return self.computed / self.batches if self.batches else 0.0

    @property
    def mean_queue_wait(self) -> float:
        return self.queue_wait / self.computed if self.computed else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "submitted": self.submitted,
            "computed": self.computed,
            "deduplicated": self.deduplicated,
            "batches": self.batches,
            "failed_batches": self.failed_batches,
            "cancelled": self.cancelled,
            "mean_batch_size": self.mean_batch_size,
            "max_batch_size": self.max_batch_size,
            "mean_queue_wait_s": self.mean_queue_wait,
            "model_time_s": self.model_time,
        }


class _Entry:
    """One distinct request waiting for a batch, and every future that wants it."""

    __slots__ = ("request", "futures", "arrival")

    def __init__(self, request: Any, arrival: float) -> None:
        self.request = request
        self.futures: list[asyncio.Future] = []
        self.arrival = arrival

    def live_futures(self) -> list[asyncio.Future]:
        return [f for f in self.futures if not f.done()]


class _LoopState:
    """Per-event-loop queue and worker task (a batcher may serve several loops).

    It holds its loop strongly (the worker task and the event do too), so the batcher
    forgets it as soon as the worker ends (``asyncio.run`` cancels it when its loop
    finishes) and drops the state of any loop found closed: a program that runs one
    event loop per step (sync wrappers, CLIs, notebooks) keeps no loop, future or row
    of a finished step alive.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[Hashable, _Entry] = {}
        self.wake = asyncio.Event()
        self.worker: asyncio.Task | None = None
        self.last_arrival = 0.0
        self.arrivals = 0  # submits so far (the tick policy watches it move)
        self.running = False  # a batch is with batch_fn now
        self.stopped = False  # reset/close: the worker finishes its running batch, then exits


_unique = itertools.count()

#: the batcher's timer policies (see the module docstring)
POLICIES = ("deadline", "tick", "debounce")

#: tick-policy workers yielding on each loop right now (they do not count as work to wait for)
_SETTLING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()


class AutoBatcher(Generic[Req, Res]):
    """Gathers concurrent requests into batches for a synchronous ``batch_fn``.

    Args:
        batch_fn: ``list[Req] -> Sequence[Res | Exception]``, results in request order.
        batch_size: most distinct requests per call of ``batch_fn``.
        timeout: seconds a request may wait for others (see the module docstring).
        policy: ``"tick"`` (default), ``"deadline"`` or ``"debounce"`` (see the module
            docstring).
        run_in_thread: run ``batch_fn`` in a worker thread (default). ``False`` runs it
            on the event loop, for batch functions that cost next to nothing.
        max_concurrency: model calls that may run at once (1 unless the engine is
            safe for more).
        lock: what every call of ``batch_fn`` holds (a lock or semaphore, shared with other
            code that calls the same engine); default ``threading.Semaphore(max_concurrency)``.
        name: used in error messages and thread names.
        copy_result: makes the copy each further caller of a shared key gets (default
            :func:`~genlm_core.engine.memory.private_copy`); ``None`` shares one result object
            (for immutable results).
    """

    def __init__(
        self,
        batch_fn: Callable[[list[Req]], Sequence[Res | BaseException]],
        *,
        batch_size: int = 64,
        timeout: float = 0.002,
        policy: Literal["deadline", "tick", "debounce"] = "tick",
        run_in_thread: bool = True,
        max_concurrency: int = 1,
        name: str = "batcher",
        copy_result: Callable[[Res], Res] | None = private_copy,
        lock: Any = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= timeout < float("inf"):  # NaN fails too; inf would never run a lone request
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(map(repr, POLICIES))}, got {policy!r}")
        self.batch_fn = batch_fn
        self.batch_size = batch_size
        self.timeout = timeout
        self.policy = policy
        self.run_in_thread = run_in_thread
        self.name = name
        self.copy_result = copy_result
        self.stats = BatcherStats()
        #: held by every call of ``batch_fn`` (the async worker's and :meth:`run_sync`'s)
        self.lock = lock if lock is not None else threading.Semaphore(max_concurrency)
        self._max_concurrency = max_concurrency
        self._executor: ThreadPoolExecutor | None = None
        # a plain dict: a state holds its loop strongly, so a weak key would never die;
        # states leave when their worker ends or their loop is found closed
        self._states: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        self._closed = False

    # ------------------------------------------------------------------ public API
    async def submit(self, request: Req, key: Hashable | None = None) -> Res:
        """Queue ``request`` and wait for its result.

        ``key`` identifies identical requests (e.g. the whole token tuple); ``None``
        means the request is never merged with another.
        """
        if self._closed:
            raise BatcherClosed(f"{self.name}: the batcher is closed")
        state = self._state()
        loop = state.loop
        now = loop.time()
        if key is None:
            key = ("__unique__", next(_unique))
        entry = state.pending.get(key)
        if entry is None:
            entry = _Entry(request, now)
            state.pending[key] = entry
        else:
            self.stats.deduplicated += 1
        fut = loop.create_future()
        entry.futures.append(fut)
        state.last_arrival = now
        state.arrivals += 1
        self.stats.submitted += 1
        if len(state.pending) == 1 or len(state.pending) >= self.batch_size:
            state.wake.set()
        if state.worker is None or state.worker.done():
            self._states[loop] = state  # an ended worker forgot this state
            state.worker = loop.create_task(self._worker(state), name=f"{self.name}-worker")
        try:
            return await fut
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            raise

    model_lock = _deprecated.renamed_property(
        "AutoBatcher.model_lock",
        "lock",
        "use AutoBatcher.lock, or backend.engine_lock for a backend's engine",
    )

    def run_sync(self, requests: list[Req]) -> list[Res]:
        """Run ``batch_fn`` directly (the synchronous path), under the model lock."""
        with self.lock:
            results = list(self.batch_fn(list(requests)))
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results

    def pending_count(self) -> int:
        """Requests waiting (not yet handed to ``batch_fn``) on all event loops."""
        return sum(len(s.pending) for s in list(self._states.values()))

    def reset(self) -> None:
        """Fail every queued caller with :class:`BatcherClosed` and start afresh.

        A batch already handed to ``batch_fn`` completes and its callers get its
        results. Never needed to recover from a failed batch (failures reach their
        callers); kept for genlm-backend's ``reset_async_queries`` callers. Callable from
        any thread.
        """
        self._stop_all(f"{self.name}: the batcher was reset while this request was queued")

    def close(self) -> None:
        """Fail queued callers, let a running batch finish, stop the workers and the thread.

        Blocks until a batch running in the worker thread returns. Later ``submit``
        calls raise :class:`BatcherClosed`.
        """
        if self._closed:
            return
        self._closed = True
        self._stop_all(f"{self.name}: the batcher was closed while this request was queued")
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ internals
    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            self._forget_closed_loops()
            state = _LoopState(loop)
            self._states[loop] = state
        return state

    def _forget_closed_loops(self) -> None:
        """Drop the states of loops closed without ending our worker (``loop.close()``
        with the worker still waiting): nothing can be delivered on them any more."""
        for loop in [loop for loop in self._states if loop.is_closed()]:
            del self._states[loop]

    def _forget(self, state: _LoopState) -> None:
        if self._states.get(state.loop) is state:
            del self._states[state.loop]

    def _stop_all(self, message: str) -> None:
        states, self._states = list(self._states.values()), {}
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for state in states:
            if state.loop.is_closed():
                continue  # its futures can never be awaited again
            if running is state.loop:
                self._stop(state, message)
            else:  # futures belong to their loop's thread
                try:
                    state.loop.call_soon_threadsafe(self._stop, state, message)
                except RuntimeError:  # the loop closed meanwhile
                    pass

    def _stop(self, state: _LoopState, message: str) -> None:
        """On ``state.loop``: fail the queue; the worker exits (after its running batch)."""
        state.stopped = True
        self._fail_pending(state, message)
        worker = state.worker
        if worker is not None and not worker.done():
            if state.running:
                state.wake.set()  # it checks ``stopped`` once its batch is delivered
            else:
                worker.cancel()

    @staticmethod
    def _fail_entries(entries: Sequence[_Entry], message: str) -> None:
        for entry in entries:
            for fut in entry.futures:
                if not fut.done() and not fut.get_loop().is_closed():
                    fut.set_exception(BatcherClosed(message))

    def _fail_pending(self, state: _LoopState, exc: BaseException | str) -> None:
        pending, state.pending = state.pending, {}
        if isinstance(exc, str):
            self._fail_entries(list(pending.values()), exc)
            return
        for entry in pending.values():
            for fut in entry.futures:
                if not fut.done() and not fut.get_loop().is_closed():
                    fut.set_exception(exc)

    def _deadline(self, state: _LoopState) -> float:
        if self.policy == "debounce":
            return state.last_arrival + self.timeout
        first = next(iter(state.pending.values()))
        return first.arrival + self.timeout

    async def _settle(self, state: _LoopState) -> None:
        """Tick policy: yield to the loop until the batch is full, or nothing but other
        settling batchers is ready to run (every task that could submit now has), or a
        loop iteration brought no new request once ``timeout`` has passed since we
        started. Every iteration that does not end it adds a request, so it ends within
        ``batch_size`` iterations. On loops without CPython's ready queue: as soon as
        an iteration brings no new request."""
        loop = state.loop
        start = loop.time()
        ready = getattr(loop, "_ready", None)  # CPython's queue of ready callbacks
        if not hasattr(ready, "__len__"):
            ready = None
        while len(state.pending) < self.batch_size and not state.stopped:
            seen = len(state.pending)
            _SETTLING[loop] = _SETTLING.get(loop, 0) + 1
            try:
                await asyncio.sleep(0)  # every callback ready now runs before we resume
            finally:
                _SETTLING[loop] -= 1
            quiet = len(state.pending) == seen
            if ready is None:
                if quiet:
                    return
            elif len(ready) <= _SETTLING.get(loop, 0):  # only other settling workers are ready
                return
            elif quiet and loop.time() - start >= self.timeout:
                return

    def _take_batch(self, state: _LoopState) -> list[_Entry]:
        batch: list[_Entry] = []
        while state.pending and len(batch) < self.batch_size:
            key = next(iter(state.pending))
            entry = state.pending.pop(key)
            if entry.live_futures():  # every caller cancelled: drop, no slot used
                batch.append(entry)
        return batch

    async def _worker(self, state: _LoopState) -> None:
        loop = state.loop
        try:
            while not state.stopped:
                if not state.pending:
                    state.wake.clear()
                    await state.wake.wait()
                    continue
                if len(state.pending) < self.batch_size and self.policy == "tick":
                    await self._settle(state)
                elif len(state.pending) < self.batch_size:
                    delay = self._deadline(state) - loop.time()
                    if delay > 0:
                        state.wake.clear()
                        try:
                            await asyncio.wait_for(state.wake.wait(), delay)
                        except TimeoutError:
                            pass
                        # woken early: loop to re-check fullness / new deadline
                        if len(state.pending) < self.batch_size and loop.time() < self._deadline(state):
                            continue
                batch = self._take_batch(state)
                if batch:
                    await self._run_batch(state, batch)
                del batch  # the delivered batch (futures holding rows) must not outlive its turn
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug here must not leave callers hanging
            self._fail_pending(state, exc)
            raise
        finally:  # stopped, cancelled with its loop, or failed: nobody may wait forever
            if state.pending:
                self._fail_pending(state, f"{self.name}: the batcher's worker stopped")
            self._forget(state)

    async def _run_batch(self, state: _LoopState, batch: list[_Entry]) -> None:
        loop = state.loop
        requests = [e.request for e in batch]
        start = loop.time()
        self.stats.batches += 1
        self.stats.computed += len(batch)
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(batch))
        if len(self.stats.batch_sizes) < 100_000:
            self.stats.batch_sizes.append(len(batch))
        self.stats.queue_wait += sum(start - e.arrival for e in batch)
        t0 = time.perf_counter()
        state.running = True
        try:
            if self.run_in_thread:
                results = await loop.run_in_executor(self._get_executor(), self._locked_call, requests)
            else:
                results = self._locked_call(requests)
            if len(results) != len(batch):
                raise RuntimeError(
                    f"{self.name}: batch function returned {len(results)} results for {len(batch)} requests"
                )
        except asyncio.CancelledError:
            # the worker itself was cancelled (its loop is shutting down): its callers were not
            self.stats.failed_batches += 1
            self._fail_entries(batch, f"{self.name}: the batcher's worker was cancelled while this batch ran")
            raise
        except BaseException as exc:  # noqa: BLE001 - delivered to every caller
            self.stats.failed_batches += 1
            self.stats.model_time += time.perf_counter() - t0
            for entry in batch:
                for fut in entry.futures:
                    if not fut.done():
                        fut.set_exception(exc)
            return
        finally:
            state.running = False
        self.stats.model_time += time.perf_counter() - t0
        for entry, result in zip(batch, results):
            self._deliver(entry, result)

    def _deliver(self, entry: _Entry, result: Any) -> None:
        if isinstance(result, BaseException):
            for fut in entry.futures:
                if not fut.done():
                    fut.set_exception(result)
            return
        first = True
        for fut in entry.futures:
            if fut.done():  # cancelled meanwhile
                continue
            if first or self.copy_result is None:
                fut.set_result(result)
                first = False
            else:
                fut.set_result(self.copy_result(result))

    def _locked_call(self, requests: list[Req]) -> list[Res | BaseException]:
        with self.lock:
            return list(self.batch_fn(requests))

    def _get_executor(self) -> ThreadPoolExecutor:
        if self._closed:
            raise BatcherClosed(f"{self.name}: the batcher was closed before this batch could start")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self._max_concurrency, thread_name_prefix=f"genlm-{self.name}"
            )
        return self._executor

    def __del__(self) -> None:  # pragma: no cover - best effort
        ex = getattr(self, "_executor", None)
        if ex is not None:
            ex.shutdown(wait=False, cancel_futures=True)
