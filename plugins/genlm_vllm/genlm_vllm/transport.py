"""How captured rows travel from vLLM worker processes back to the backend.

Three ways, picked per worker and per batch:

* **in process** (one worker in this process, ``engine.in_process``): the worker's own
  tensors, no copy (see :mod:`genlm_vllm.capture`).
* **shared memory** (worker processes on this machine): the engine owns a ``/dev/shm``
  row buffer and the replying worker copies its rows straight into it: the core's
  :mod:`genlm_core.engine.row_transport`, shared with ``genlm serve``.
* **bytes** (a worker that cannot open the engine's buffer): float32 bytes inside the
  RPC reply.

What lives here is vLLM's own: removing the segments an engine's killed processes
leave in ``/dev/shm`` (:func:`mapped_segments`, :func:`remove_engine_segments`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from genlm_core.engine import old_names, row_transport

__all__ = ["ENGINE_SEGMENT_PREFIXES", "mapped_segments", "remove_engine_segments"]

#: the core's row transport names this module answered for: genlm_vllm._deprecated
__getattr__ = old_names(__name__)


#: what an engine's processes keep in /dev/shm: Python shared memory (vLLM's message
#: queues between the executor and its workers), multiprocessing's named semaphores
#: (the executor's worker lock), vLLM's CPU communicator (``...-cpushm_<rank>``)
ENGINE_SEGMENT_PREFIXES = ("psm_", "sem.mp-")


def mapped_segments(pids: list[int]) -> set[str]:
    """The ``/dev/shm`` names that processes ``pids`` have mapped (``/proc/<pid>/maps``).

    Matched by inode: a POSIX named semaphore (multiprocessing's locks) is mapped under
    the temporary name glibc created it with (``sem.XXXXXX (deleted)``), then linked to
    its real name (``sem.mp-...``). Empty where the maps cannot be read."""
    inodes: set[int] = set()
    names: set[str] = set()
    prefix = row_transport.SHM_DIR + "/"
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                    if len(fields) == 6 and fields[5].startswith(prefix):
                        inodes.add(int(fields[4]))
                        names.add(fields[5].strip()[len(prefix) :].removesuffix(" (deleted)"))
        except (OSError, ValueError):
            continue
    if inodes:
        for name in os.listdir(row_transport.SHM_DIR):
            try:
                if os.stat(os.path.join(row_transport.SHM_DIR, name)).st_ino in inodes:
                    names.add(name)
            except OSError:
                continue
    return names


def remove_engine_segments(names: Iterable[str], idents: Sequence[str] = ()) -> list[str]:
    """Unlink what an engine's processes left in ``/dev/shm`` once they are gone.

    ``names``: segments its processes had mapped (:func:`mapped_segments`), of the
    kinds in :data:`ENGINE_SEGMENT_PREFIXES` or vLLM's CPU communicator (``cpushm``);
    ``idents``: the engine's ``VLLM_DIST_IDENT`` (``vllm_dist_<random hex>``, or the port
    of a ``tcp://`` init method), whose CPU communicator segments
    (``<ident>-<group>-cpushm_<rank>``) go too. A process removes what it created when
    it exits normally; one that is killed (a fault, a shutdown that outlasted its grace
    period, a Ray actor ended by ``ray.kill``) leaves its message queue, the executor's
    lock and its communicator segment behind for good. Returns the names removed."""
    if not row_transport.shm_available():
        return []
    wanted = {
        n for n in names if n and os.sep not in n and (n.startswith(ENGINE_SEGMENT_PREFIXES) or "cpushm" in n)
    }
    prefixes = tuple(f"{i}-" for i in idents if i and os.sep not in i)
    removed = []
    for name in os.listdir(row_transport.SHM_DIR):
        if name in wanted or (prefixes and name.startswith(prefixes) and "cpushm" in name):
            try:
                os.unlink(os.path.join(row_transport.SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed
