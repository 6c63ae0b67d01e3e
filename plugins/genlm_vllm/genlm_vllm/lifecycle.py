"""The engine's processes, from start to shutdown, and what a dead engine looks like.

* :class:`EngineDiedError` and :func:`engine_failed` (vLLM marked its engine failed);
  :class:`Watchdog` marks the engine dead as soon as a worker process on this
  machine exits, so queued callers fail at once;
* the engine's processes on this machine (:func:`engine_processes`, their workers and
  a separate engine core) and what they map in ``/dev/shm`` (:func:`mapped`), so
  ``close()`` can remove what killed processes leave there;
* in-process engines (:func:`engine_in_process`, :data:`LIVE_IN_PROCESS`) share this
  process's vLLM distributed state: :func:`keep_distributed_state` keeps it while
  another one is open;
* :func:`shutdown`: stop the engine core and its workers and free their memory.

psutil and vLLM are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

import torch

__all__ = [
    "LIVE_IN_PROCESS",
    "EngineDiedError",
    "Watched",
    "Watchdog",
    "alive",
    "core_shutdown_timeout",
    "engine_failed",
    "engine_in_process",
    "engine_processes",
    "mapped",
    "shutdown",
]


class Watched(Protocol):
    """What the watchdog watches: an engine with worker processes."""

    workers: list[dict[str, Any]]
    closed: bool

    def mark_dead(self, reason: str) -> None: ...


#: in-process engines alive in this process (they share vLLM's distributed state: the
#: parallel groups of this process, which an engine core's shutdown would destroy)
LIVE_IN_PROCESS: "weakref.WeakSet[Any]" = weakref.WeakSet()


class EngineDiedError(RuntimeError):
    """A process of the vLLM engine died: the engine (and its backend) cannot answer any more."""


def engine_failed(llm: Any) -> bool:
    """Whether vLLM itself marked its engine (core or executor) failed."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    if core is None:
        return False
    if getattr(getattr(core, "resources", None), "engine_dead", False):
        return True
    executor = getattr(getattr(core, "engine_core", None), "model_executor", None)
    return bool(getattr(executor, "is_failed", False))


class Watchdog:
    """Watches the engine's worker processes on this machine; marks the engine dead
    as soon as one exits, so queued callers fail at once instead of waiting on it."""

    def __init__(self, engine: Watched, interval: float = 0.2) -> None:
        import socket
        import threading

        host = socket.gethostname()
        self._pids = [w["pid"] for w in engine.workers if w.get("host") == host and w.get("pid")]
        self._engine = weakref.ref(engine)
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, name="genlm-vllm-watchdog", daemon=True)
        if self._pids:
            self._thread.start()

    def _run(self) -> None:
        import psutil

        procs = []
        for pid in self._pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                procs.append(None)
        while not self._stop.wait(self._interval):
            engine = self._engine()
            if engine is None or engine.closed:
                return
            for pid, proc in zip(self._pids, procs):
                try:
                    alive = proc is not None and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
                except psutil.Error:
                    alive = False
                if not alive:
                    engine.mark_dead(f"vLLM worker process {pid} died")
                    return
            del engine

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def engine_processes(workers: list[dict[str, Any]]) -> list[Any]:
    """The engine's processes on this machine (``psutil.Process``, which tells a reused
    pid from the original): its workers, and their parent when that is not this
    process (the engine core in a process of its own)."""
    import socket

    import psutil

    host = socket.gethostname()
    procs: dict[int, Any] = {}
    for w in workers:
        if w.get("host") != host or not w.get("pid"):
            continue
        try:
            proc = psutil.Process(int(w["pid"]))
            procs[proc.pid] = proc
            parent = proc.parent()
        except psutil.Error:
            continue
        if parent is not None and parent.pid not in (os.getpid(), 0, 1):
            procs.setdefault(parent.pid, parent)
    return list(procs.values())


def running(procs: list[Any]) -> list[Any]:
    import psutil

    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def mapped(procs: list[Any]) -> set[str]:
    """What those of ``procs`` that still run map in ``/dev/shm``."""
    from genlm_vllm.transport import mapped_segments

    return mapped_segments([p.pid for p in running(procs)])


def alive(procs: list[Any], within: float = 0.0) -> bool:
    """Whether any of ``procs`` still runs ``within`` seconds from now (it may be on its way
    out: after a worker died, vLLM's executor stops the others from a thread of its own)."""
    import time

    deadline = time.monotonic() + within
    while running(procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(running(procs))


def engine_in_process(llm: Any) -> bool:
    """Whether the engine core and its only worker run in this process."""
    engine = llm.llm_engine
    parallel = engine.vllm_config.parallel_config
    inproc = type(engine.engine_core).__name__ == "InprocClient"
    return inproc and parallel.world_size == 1 and parallel.distributed_executor_backend in (None, "uni")


@contextlib.contextmanager
def keep_distributed_state() -> Iterator[None]:
    """Skip the teardown of this process's parallel groups in an engine core's shutdown.

    vLLM keeps its distributed state (``torch.distributed``'s default group, the TP/PP
    groups) per process; every in-process engine (one worker here, world size 1) joins
    the same groups, and ``EngineCore.shutdown`` destroys them
    (``cleanup_dist_env_and_memory``) - also when the closing engine's own workers are
    other processes (the ``mp`` executor), whose groups live there. The engines still
    open in this process would then fail their next step (``pipeline model parallel
    group is not initialized``). While one is open, the teardown is skipped (its memory
    part, a garbage collection, is kept); the last engine to close does it.
    """
    try:
        import vllm.v1.engine.core as core_module
    except ImportError:  # pragma: no cover - another vLLM layout
        yield
        return
    original = getattr(core_module, "cleanup_dist_env_and_memory", None)
    if original is None:  # pragma: no cover
        yield
        return
    core_module.cleanup_dist_env_and_memory = lambda *args, **kwargs: gc.collect()
    try:
        yield
    finally:
        core_module.cleanup_dist_env_and_memory = original


def core_shutdown_timeout() -> float:
    """Seconds an engine core in its own process gets to stop (then it is killed).

    vLLM's client gives it 5 s, and the core itself waits
    ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` (5) for its workers, then 4 s after a
    SIGTERM: on a loaded machine the client kills the core while it still waits, its
    workers are killed in turn and their shared-memory segments (vLLM's CPU
    communicator, its message queues) stay in ``/dev/shm``. Long enough for the
    core's own sequence, plus a margin."""
    import vllm.envs

    return float(vllm.envs.VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS) + 4.0 + 10.0


def shutdown(llm: Any, keep_distributed: bool = False) -> None:
    """Stop the engine core (and its workers/processes) and free its memory;
    ``keep_distributed``: leave this process's parallel groups to the engines still open."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    if core is not None:
        with keep_distributed_state() if keep_distributed else contextlib.nullcontext():
            if type(core).__name__ == "InprocClient":
                core.shutdown()
            else:
                core.shutdown(timeout=core_shutdown_timeout())
    del engine, core
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
