"""How captured rows travel from vLLM worker processes back to the backend.

Three ways, picked per worker and per batch:

* **in process** (one worker in this process, ``llm.in_process``): the worker's own
  tensors, no copy (see :mod:`genlm_vllm.capture`).
* **shared memory** (worker processes on this machine: ``tensor_parallel_size`` /
  ``pipeline_parallel_size`` > 1 with the ``mp`` or ``ray`` executor, the
  multiprocessing engine core): the backend owns one file in ``/dev/shm``
  (:class:`RowBuffer`); the replying worker copies its rows straight into it
  (``index_select`` result -> mapped file: the one copy) and the RPC carries only a
  few bytes of bookkeeping. The backend then stacks the rows out of the mapping.
* **bytes** (a worker that cannot open the backend's buffer: another node of a Ray
  cluster, a platform without ``/dev/shm``, a buffer too small for an unexpected row
  length): float32 bytes inside the RPC reply (vLLM's RPC results carry no tensors).

A worker knows the buffer is the backend's by a random nonce in its header (a file
of the same name on another node would not carry it). Only one worker replies with
rows: the first tensor-parallel rank of the last pipeline stage (every tensor-parallel
rank holds the full logits rows; earlier pipeline stages hold none); the others only
drop theirs. The buffer is created and unlinked by the backend process, so a worker
killed mid-batch cannot leave a segment behind.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "RowBuffer",
    "SHM_DIR",
    "write_rows",
    "HEADER",
    "mapped_segments",
    "remove_engine_segments",
    "sweep_stale_buffers",
]

SHM_DIR = "/dev/shm"
#: header: 16 bytes of nonce, then padding to keep rows 64-byte aligned
HEADER = 64
_NONCE = 16


def copy_row(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``; between float32 CPU tensors a plain single-threaded memcpy.

    Torch splits a copy this large (a row of 49k-152k floats) between its intra-op
    threads, one parallel region (a thread barrier) per row; on a busy machine a barrier
    whose other thread is descheduled costs a time slice: 32 rows took 250 ms instead of
    0.5 ms on a loaded 2-core machine. The copy is bound by memory bandwidth, so one
    thread loses nothing."""
    if dst.device.type == "cpu" and src.device.type == "cpu" and dst.dtype == src.dtype == torch.float32:
        np.copyto(dst.numpy(), src.numpy())
    else:
        dst.copy_(src)


def stack_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(rows)``; for float32 CPU rows one single-threaded copy (see :func:`copy_row`)."""
    if all(r.device.type == "cpu" and r.dtype == torch.float32 for r in rows):
        return torch.from_numpy(np.stack([r.detach().numpy() for r in rows]))
    return torch.stack(rows)


def shm_available() -> bool:
    return sys.platform.startswith("linux") and os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class RowBuffer:
    """A ``/dev/shm`` file owned by the backend that workers write rows into."""

    def __init__(self, namespace: str) -> None:
        self.name = f"genlm-vllm-{os.getpid()}-{namespace}"
        self.path = os.path.join(SHM_DIR, self.name)
        self.nonce = secrets.token_bytes(_NONCE)
        self.capacity = 0  # bytes of row space
        self._fd: int | None = None
        self._map: mmap.mmap | None = None

    def ensure(self, nbytes: int) -> None:
        """Make room for ``nbytes`` of rows (grows, never shrinks)."""
        if nbytes <= self.capacity and self._map is not None:
            return
        size = HEADER + max(nbytes, 2 * self.capacity)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            # held while this process lives: sweep_stale_buffers() leaves a locked file alone
            fcntl.flock(self._fd, fcntl.LOCK_SH)
        os.ftruncate(self._fd, size)
        if self._map is not None:
            self._map.close()
        self._map = mmap.mmap(self._fd, size)
        self._map[:_NONCE] = self.nonce
        self.capacity = size - HEADER

    def rows(self, n: int, width: int) -> torch.Tensor:
        """A ``(n, width)`` float32 copy of the first ``n`` rows the worker wrote."""
        assert self._map is not None and n * width * 4 <= self.capacity
        view = np.frombuffer(self._map, dtype=np.float32, count=n * width, offset=HEADER)
        return torch.from_numpy(view.reshape(n, width).copy())  # one memcpy, one thread

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "nonce": self.nonce, "capacity": self.capacity}

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_stale_buffers() -> list[str]:
    """Unlink the row buffers of backends that died without ``close()`` (a process
    killed with SIGKILL, e.g. a Ray actor ended by ``ray.kill``). A buffer is stale when
    the pid in its name is not running here *and* no process holds the lock its owner
    takes for its lifetime (the lock also covers an owner in another pid namespace that
    shares this ``/dev/shm``). Returns the names removed."""
    if not shm_available():
        return []
    removed = []
    for name in os.listdir(SHM_DIR):
        parts = name.split("-")
        if not name.startswith("genlm-vllm-") or len(parts) < 4 or not parts[2].isdigit():
            continue
        if _pid_alive(int(parts[2])):
            continue
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue  # gone, or not ours to touch
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner still runs
        else:
            try:
                os.unlink(path)
                removed.append(name)
            except FileNotFoundError:
                pass
        finally:
            os.close(fd)
    return removed


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
    prefix = SHM_DIR + "/"
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
        for name in os.listdir(SHM_DIR):
            try:
                if os.stat(os.path.join(SHM_DIR, name)).st_ino in inodes:
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
    if not shm_available():
        return []
    wanted = {
        n for n in names if n and os.sep not in n and (n.startswith(ENGINE_SEGMENT_PREFIXES) or "cpushm" in n)
    }
    prefixes = tuple(f"{i}-" for i in idents if i and os.sep not in i)
    removed = []
    for name in os.listdir(SHM_DIR):
        if name in wanted or (prefixes and name.startswith(prefixes) and "cpushm" in name):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


# ---------------------------------------------------------------- worker side
_OPEN: dict[str, tuple[int, mmap.mmap]] = {}  # buffer name -> (size, mapping) in a worker


def _mapping(desc: dict[str, Any], nbytes: int) -> mmap.mmap | None:
    """The worker's mapping of the backend's buffer, or None where it cannot be used."""
    name = desc["name"]
    if os.sep in name or not shm_available():
        return None
    cached = _OPEN.get(name)
    if cached is not None and cached[0] >= HEADER + nbytes:
        mapping = cached[1]
    else:
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        except OSError:
            return None  # another machine, or the backend is gone
        try:
            size = os.fstat(fd).st_size
            if size < HEADER + nbytes:
                return None
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        if cached is not None:
            cached[1].close()
        _OPEN[name] = (size, mapping)
    if mapping[:_NONCE] != desc["nonce"]:
        return None  # a file of the same name that is not the backend's
    return mapping


def forget(name: str) -> None:
    entry = _OPEN.pop(name, None)
    if entry is not None:
        entry[1].close()


def write_rows(rows: list[torch.Tensor | None], desc: dict[str, Any] | None) -> dict[str, Any]:
    """Worker side: hand ``rows`` back through the buffer when possible, else as bytes.

    Returns ``{"width", "present", "shm": True}`` (rows at their batch position in the
    buffer) or ``{"width", "present", "bytes": [...]}``.
    """
    present = [r is not None for r in rows]
    got = [r for r in rows if r is not None]
    width = int(got[0].shape[-1]) if got else 0
    out: dict[str, Any] = {"width": width, "present": present}
    mapping = None if desc is None or not got else _mapping(desc, len(rows) * width * 4)
    if mapping is not None:
        view = torch.frombuffer(mapping, dtype=torch.float32, count=len(rows) * width, offset=HEADER)
        view = view.view(len(rows), width)
        for i, r in enumerate(rows):
            if r is not None:
                copy_row(view[i], r.detach().reshape(-1))  # device -> host and to float32 in one copy
        del view
        out["shm"] = True
        return out
    out["bytes"] = [
        None if r is None else r.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
        for r in rows
    ]
    return out
