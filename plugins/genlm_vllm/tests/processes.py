"""What the multi-process vLLM suites share: environment overrides, the process and
``/dev/shm`` leftovers checks, and a local Ray cluster started and stopped by a test."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import psutil


@contextlib.contextmanager
def env(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` for the block, restored afterwards."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def shm_segments() -> set[str]:
    """The backends' row buffers in ``/dev/shm`` (see ``genlm_vllm.transport``) and the
    segments of vLLM's CPU communicator (``vllm_dist_<engine>-<group>-cpushm_<rank>``)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(("genlm-vllm-", "vllm_dist_"))}


def descendants() -> set[int]:
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


def alive(pids: Iterable[int]) -> set[int]:
    """Those of ``pids`` that still run (zombies count as gone)."""
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def _cmdlines(pids: Iterable[int]) -> list[list[str]]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.append(psutil.Process(pid).cmdline()[:3])
    return out


def engine_segments(workers: list[dict[str, Any]]) -> set[str]:
    """What an engine's processes map in ``/dev/shm`` now (its message queues, the
    executor's lock, the CPU communicator, the row buffer): its workers and, when the
    engine core runs in a process of its own, their parent."""
    from genlm_vllm.transport import mapped_segments

    pids = {int(w["pid"]) for w in workers}
    for pid in list(pids):
        with contextlib.suppress(psutil.Error):
            pids.add(psutil.Process(pid).ppid())
    pids -= {os.getpid(), 0, 1}
    return mapped_segments(sorted(pids))


def assert_gone(
    kids: set[int],
    segments: set[str],
    within: float = 30.0,
    also: Iterable[int] = (),
    engine: Iterable[str] = (),
) -> None:
    """No child process beyond ``kids``, none of ``also`` (e.g. orphans of a killed
    process, which are no longer our descendants), no row buffer or CPU-communicator
    segment beyond ``segments`` and none of ``engine`` (what the engine's processes had
    mapped: :func:`engine_segments`) once ``within`` seconds have passed."""
    also, engine = set(also), set(engine)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and ((descendants() - kids) or alive(also)):
        time.sleep(0.5)
    left = (descendants() - kids) | alive(also)
    assert not left, _cmdlines(left)
    assert shm_segments() <= segments, shm_segments() - segments
    still = sorted(engine & set(os.listdir("/dev/shm")))
    assert not still, f"the engine's shared memory is still in /dev/shm: {still}"


class LocalRay:
    """A Ray cluster on this machine (loopback, ``num_cpus`` CPUs, no dashboard),
    started by :meth:`start` and stopped by :meth:`stop` with every process it began.

    On a loaded 2-core box the raylet sometimes gives up waiting for its dashboard
    agent (a crash in WaitForDashboardAgentPorts after ~15 s) and ``ray.init`` raises
    "The current node timed out during startup": it is started again (Ray's own state
    is gone by then), at most ``attempts`` times.
    """

    def __init__(self, num_cpus: int = 2) -> None:
        self.num_cpus = num_cpus
        self.kids_before: set[int] = set()
        self.running = False

    def start(self, attempts: int = 3) -> "LocalRay":
        import ray  # scripts/setup_env.sh installs it: the tests using it are never skipped

        self.kids_before = descendants()
        for attempt in range(attempts):
            try:
                with env("RAY_agent_register_timeout_ms", "180000"):
                    ray.init(
                        num_cpus=self.num_cpus,
                        include_dashboard=False,
                        _node_ip_address="127.0.0.1",
                        log_to_driver=False,
                    )
                break
            except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception here
                ray.shutdown(wait_for_processes=True)
                self._end_leftovers()
                if attempt == attempts - 1 or "timed out during startup" not in str(exc):
                    raise
        self.running = True
        return self

    def _end_leftovers(self) -> None:
        """A failed ``ray.init`` leaves the processes it started (no node to shut
        down): end them, by pid."""
        procs = []
        for pid in descendants() - self.kids_before:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                proc.kill()
                procs.append(proc)
        psutil.wait_procs(procs, timeout=10)

    @staticmethod
    def alive_actors() -> dict[str, Any]:
        """The GCS actor table's ALIVE actors (no dashboard needed)."""
        from ray._private.state import actors

        return actors(actor_state_name="ALIVE")

    def stop(self) -> None:
        """``ray.shutdown``, waiting for Ray's processes (they get SIGTERM and, without
        waiting, may outlive a leftovers check). Idempotent."""
        if not self.running:
            return
        import ray

        self.running = False
        ray.shutdown(wait_for_processes=True)


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and all its descendants (a Ray cluster
    started here, its actors and their engine ranks included)."""
    total = 0.0
    for p in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def ray_get_while_progressing(ref: Any, what: str, stall_s: float = 300.0, poll_s: float = 5.0) -> Any:
    """``ray.get(ref)`` for work that may take long on a loaded machine (an engine start):
    waits as long as the processes under this one keep using CPU, and fails only when
    none did for ``stall_s`` seconds (a hang), never because the machine is slow."""
    import ray
    from ray.exceptions import GetTimeoutError

    last, last_t = tree_cpu_seconds(), time.monotonic()
    while True:
        try:
            return ray.get(ref, timeout=poll_s)
        except GetTimeoutError:
            pass
        used, now = tree_cpu_seconds(), time.monotonic()
        if used > last + 0.5:  # half a CPU-second of work since the last progress
            last, last_t = used, now
        assert now - last_t < stall_s, f"{what}: no CPU used by any process for {stall_s:.0f} s (a hang)"
