"""Rows of float32 through ``/dev/shm``: one implementation for every process boundary.

Two users, one mechanism:

* **genlm-vllm** (worker processes of one engine -> its backend): the backend owns a
  :class:`RowBuffer`; the replying worker copies its rows straight into it
  (:func:`write_rows`) and the RPC carries only a few bytes of bookkeeping. Rows that
  cannot go through it (another node of a Ray cluster, no ``/dev/shm``, a buffer too
  small) travel as float32 bytes inside the RPC reply.
* **genlm serve** (one server -> its clients on the same host, :mod:`genlm_core.serve`):
  the *client* owns the buffer and names it in its request; the server writes the
  batch's rows into it (:func:`write_block`) and answers with a frame that carries no
  rows. A server that cannot open it (another host, another ``/dev/shm``) answers with
  the rows in the frame instead, so the choice needs no configuration.

The reader owns the buffer: it creates, grows and unlinks it, so a writer killed
mid-batch cannot leave a segment behind. A writer knows the buffer is its reader's by a
random nonce in its header (a file of the same name on another host, or in another
container's ``/dev/shm``, would not carry it). Buffers are named
``genlm-<owner>-<pid>-<id>`` and their owner holds a lock on the file while it lives:
:func:`sweep_stale_buffers` removes those of readers that died without ``close()``.

Used by ``genlm serve`` and genlm-remote, and by genlm-vllm's worker processes
(whose own segment cleanup is :mod:`genlm_vllm.transport`).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
import sys
from typing import Any

import numpy as np
import torch

__all__ = [
    "HEADER",
    "OWNERS",
    "RowBuffer",
    "SHM_DIR",
    "copy_row",
    "forget",
    "shm_available",
    "stack_rows",
    "sweep_stale_buffers",
    "write_block",
    "write_rows",
]

SHM_DIR = "/dev/shm"
#: header: 16 bytes of nonce, then padding to keep rows 64-byte aligned
HEADER = 64
_NONCE = 16
#: who owns row buffers (the ``<owner>`` of ``genlm-<owner>-<pid>-<id>``): the sweep looks at these only
OWNERS = ("vllm", "remote")


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
    """A ``/dev/shm`` file owned by the reader (a backend, a remote client) that
    writers (engine workers, a server) copy rows into."""

    def __init__(self, namespace: str, owner: str = "vllm") -> None:
        if owner not in OWNERS:
            raise ValueError(f"RowBuffer owner must be one of {OWNERS}, got {owner!r}")
        self.name = f"genlm-{owner}-{os.getpid()}-{namespace}"
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
        if parts[0] != "genlm" or parts[1] not in OWNERS or len(parts) < 4 or not parts[2].isdigit():
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


# ---------------------------------------------------------------- writer side
_OPEN: dict[str, tuple[int, mmap.mmap]] = {}  # buffer name -> (size, mapping) in a writer


def _mapping(desc: dict[str, Any], nbytes: int) -> mmap.mmap | None:
    """The writer's mapping of the reader's buffer, or None where it cannot be used."""
    name = desc["name"]
    if not isinstance(name, str) or not name.startswith("genlm-") or os.sep in name or not shm_available():
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


def write_block(rows: np.ndarray, desc: dict[str, Any] | None, keep_open: bool = False) -> bool:
    """Writer side: copy a ``(n, width)`` float32 block into the reader's buffer at its
    start (one single-threaded memcpy). False (nothing written) where the buffer cannot
    be used: another host, a file without the reader's nonce, too small, gone.

    ``keep_open=False`` drops the mapping afterwards: a server writes into the buffers of
    many clients that come and go, and a mapping kept for a client that unlinked its
    buffer would hold the memory until the server exits."""
    if desc is None or rows.dtype != np.float32 or rows.ndim != 2:
        return False
    try:
        mapping = _mapping(desc, rows.size * 4)
        if mapping is None:
            return False
        view = np.frombuffer(mapping, dtype=np.float32, count=rows.size, offset=HEADER).reshape(rows.shape)
        np.copyto(view, rows)
        del view
        return True
    finally:
        if not keep_open:
            if isinstance(desc.get("name"), str):
                forget(desc["name"])
