"""Rows through shared memory that the *server* creates and hands to same-host clients.

A client on the server's host asks the server's Unix socket (abstract namespace: no file
anywhere; ``/v1/info`` names it as ``shm_socket``) for a segment. The server creates an
anonymous ``memfd`` (it has no name in any directory), seals its size
(``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``: neither side can truncate it under the
other's mapping, which would be a SIGBUS), and sends the client a *read-only* descriptor of
it over the socket (``SCM_RIGHTS``) with a random handle. The client names its handles in
its CONTEXTS frames; the server copies the batch's rows into its own mapping and answers
with a ROWS frame that carries none (``"segment": handle``). A segment lives as long as its
client keeps that socket connection open: when the client closes it, exits or is killed,
the kernel closes the connection, the server drops its mapping and the memory is freed.
Nothing is created in ``/dev/shm`` and the server never opens a path a client names.

Checks: the server reads each peer's credentials (``SO_PEERCRED``) to cap the segments of
one client process, caps the total, and wants the token when it has one; a handle is a
128-bit secret known only to the client that received it, so no client can aim the
server's writes at another's rows. The client checks that the socket's peer is the
process ``/v1/info`` (or a ROWS frame's ``replica``) named, and that the segment is
sealed and large enough. Where any of it fails (another host or container, a server
without the socket, the caps) rows travel in the frame, which needs no configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hmac
import json
import mmap
import os
import secrets
import socket
import struct
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from genlm_core.serve.frame import copy_rows
from genlm_core.serve.inputs import parse_json

__all__ = ["HEADER", "ClientSegment", "SegmentServer", "available"]

#: bytes before the first row (rows stay 64-byte aligned)
HEADER = 64
_SEALS = ("F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_SEAL")
_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_MAX_MESSAGE = 4096
#: segments one client process may hold (one per server process it talks to is the norm)
PER_PROCESS = 4


def available() -> bool:
    """memfd, sealing and descriptor passing: Linux."""
    return (
        sys.platform.startswith("linux")
        and hasattr(os, "memfd_create")
        and all(hasattr(fcntl, s) for s in _SEALS)
        and hasattr(socket, "send_fds")
    )


def _seal_bits() -> int:
    return fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _peer(sock: socket.socket) -> tuple[int, int, int]:
    return _CREDS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size))


# ---------------------------------------------------------------------- server side
@dataclass
class _Segment:
    handle: str
    mapping: mmap.mmap
    rows: int
    width: int
    pid: int
    uid: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    dead: bool = False
    writes: int = 0

    def drop(self) -> None:
        with self.lock:  # never while a writer copies into it
            if not self.dead:
                self.dead = True
                self.mapping.close()


class SegmentServer:
    """The server's side: a Unix socket that hands out segments, and the writer.

    ``width``: floats per row; ``max_rows``: rows of the largest segment (the server's
    batch limit); ``max_segments``: segments alive at once over all clients;
    ``max_bytes``: their sizes summed (a segment's pages are memory once rows are
    written into them, until its client lets it go)."""

    def __init__(
        self, width: int, max_rows: int, max_segments: int, token: str | None, max_bytes: int = 2 << 30
    ) -> None:
        self.width = width
        self.max_rows = max_rows
        self.max_segments = max_segments
        self.max_bytes = max_bytes
        self.token = token
        self.address: str | None = None  # "@name": an abstract Unix socket
        self.segments: dict[str, _Segment] = {}
        self.refused: dict[str, int] = {}
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()
        self._start_lock = asyncio.Lock()

    async def start(self) -> str | None:
        """Listen (once; on the running loop). The address, or None where unavailable."""
        async with self._start_lock:
            if self._listener is not None or self.max_segments == 0 or not available():
                return self.address
            name = f"genlm-serve-{os.getpid()}-{secrets.token_hex(8)}"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind("\0" + name)
                sock.listen(64)
                sock.setblocking(False)
            except OSError:
                sock.close()
                return None
            self._listener = sock
            self.address = "@" + name
            self._spawn(self._accept(sock))
            return self.address

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError:
                return  # closed
            conn.setblocking(False)
            self._spawn(self._serve(conn))

    def _refuse(self, reason: str) -> str:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        return reason

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        segment: _Segment | None = None
        try:
            pid, uid, _ = _peer(conn)
            try:
                request = await asyncio.wait_for(self._read_message(conn), 10.0)
            except (TimeoutError, EOFError):
                return
            except ValueError as exc:  # malformed: refused, saying how
                problem = f'{self._refuse("malformed")}: {exc}; send one line, a JSON object {{"rows": N}}'
                await loop.sock_sendall(conn, json.dumps({"error": problem}).encode() + b"\n")
                return
            problem = self._check(request, pid)
            if problem is not None:
                await loop.sock_sendall(conn, json.dumps({"error": problem}).encode() + b"\n")
                return
            rows = min(max(1, int(request["rows"])), self.max_rows)
            segment, ro_fd = self._create(rows, pid, uid)
            reply = {"handle": segment.handle, "rows": rows, "width": self.width, "header": HEADER}
            try:
                socket.send_fds(conn, [json.dumps(reply).encode() + b"\n"], [ro_fd])
            finally:
                os.close(ro_fd)
            self.segments[segment.handle] = segment
            # the client holds the connection while it uses the segment; it sends nothing more
            await loop.sock_recv(conn, 1)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if segment is not None:
                self.segments.pop(segment.handle, None)
                segment.drop()
            conn.close()

    async def _read_message(self, conn: socket.socket) -> dict[str, Any]:
        """The client's one line: a JSON object, parsed as strictly as a request body
        (:func:`~genlm_core.serve.inputs.parse_json`: bounded nesting, no NaN). ``ValueError``
        naming the fault; ``EOFError`` when the client sent no line."""
        loop = asyncio.get_running_loop()
        data = b""
        while b"\n" not in data:
            chunk = await loop.sock_recv(conn, _MAX_MESSAGE)
            if not chunk:
                raise EOFError("no request")
            if len(data) + len(chunk) > _MAX_MESSAGE:
                raise ValueError(f"the segment request is longer than {_MAX_MESSAGE} bytes")
            data += chunk
        return parse_json(data.split(b"\n", 1)[0], "the segment request")

    def _check(self, request: dict[str, Any], pid: int) -> str | None:
        if self.token is not None:
            given = request.get("token")
            if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.token.encode()):
                return self._refuse("token")
        rows = request.get("rows")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            return self._refuse("rows")
        if len(self.segments) >= self.max_segments:
            return self._refuse("server_limit")
        size = HEADER + min(rows, self.max_rows) * self.width * 4
        if sum(HEADER + s.rows * s.width * 4 for s in self.segments.values()) + size > self.max_bytes:
            return self._refuse("server_bytes")
        if sum(1 for s in self.segments.values() if s.pid == pid) >= PER_PROCESS:
            return self._refuse("process_limit")
        return None

    def _create(self, rows: int, pid: int, uid: int) -> tuple[_Segment, int]:
        size = HEADER + rows * self.width * 4
        fd = os.memfd_create("genlm-serve-rows", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _seal_bits())
            mapping = mmap.mmap(fd, size)
            ro_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)  # the client's: read only
        finally:
            os.close(fd)
        return _Segment(secrets.token_hex(16), mapping, rows, self.width, pid, uid), ro_fd

    def write(self, handles: list[str], rows: list[Any]) -> str | None:
        """Copy ``rows`` (float32 CPU tensors or arrays of ``width``) into the first segment
        of ``handles`` this server holds and that has room; its handle, or None (nothing
        written: answer with the frame). Thread-safe; rows on a GPU come over in one transfer
        (:func:`~genlm_core.serve.frame.copy_rows`), CPU rows in one memcpy each."""
        for handle in handles:
            seg = self.segments.get(handle)
            if seg is None:
                continue
            if len(rows) > seg.rows:
                return None
            with seg.lock:
                if seg.dead:
                    return None
                view = np.frombuffer(
                    seg.mapping, dtype=np.float32, count=len(rows) * seg.width, offset=HEADER
                )
                view = view.reshape(len(rows), seg.width)
                copy_rows(view, rows)
                del view
                seg.writes += 1
            return handle
        return None

    def stats(self) -> dict[str, Any]:
        segs = list(self.segments.values())
        return {
            "socket": self.address,
            "segments": len(segs),
            "client_processes": len({s.pid for s in segs}),
            "bytes": sum(HEADER + s.rows * s.width * 4 for s in segs),
            "refused": dict(self.refused),
        }

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        for seg in list(self.segments.values()):
            seg.drop()
        self.segments.clear()


# ---------------------------------------------------------------------- client side
class ClientSegment:
    """The client's side of one segment: a read-only mapping, the handle, the socket whose
    connection keeps the segment alive on the server (closed by :meth:`close`)."""

    def __init__(self, sock: socket.socket, handle: str, mapping: mmap.mmap, rows: int, width: int) -> None:
        self._sock = sock
        self.handle = handle
        self._map = mapping
        self.rows = rows
        self.width = width

    @classmethod
    def request(
        cls,
        address: str,
        rows: int,
        width: int,
        token: str | None,
        server_pid: int | None,
        timeout: float = 10.0,
    ) -> "ClientSegment":
        """A segment of ``rows`` rows from the server listening at ``address``. Raises
        ``OSError`` / ``ValueError`` (with the reason) where it cannot be had: the caller
        then reads rows from frames."""
        if not available() or not address.startswith("@"):
            raise ValueError("shared-memory segments need Linux and an abstract socket address")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect("\0" + address[1:])
            pid = _peer(sock)[0]
            if server_pid is not None and pid != server_pid:
                raise ValueError(
                    f"the socket's peer is pid {pid}, not the server's {server_pid} "
                    "(another pid namespace, or not the server)"
                )
            message: dict[str, Any] = {"rows": rows}
            if token is not None:
                message["token"] = token
            sock.sendall(json.dumps(message).encode() + b"\n")
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 1)
            with contextlib.ExitStack() as undo:
                for fd in fds:
                    undo.callback(os.close, fd)
                reply = json.loads(data.split(b"\n", 1)[0] or b"{}")
                if "error" in reply or len(fds) != 1:
                    raise ValueError(f"the server gave no segment: {reply.get('error', 'no descriptor')}")
                fd = fds[0]
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
                if seals & _seal_bits() != _seal_bits():
                    raise ValueError("the segment is not sealed against resizing")
                got_rows, got_width = int(reply["rows"]), int(reply["width"])
                size = HEADER + got_rows * got_width * 4
                if got_width != width or got_rows < 1 or os.fstat(fd).st_size < size:
                    raise ValueError("the segment does not hold the rows it claims")
                mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            sock.settimeout(None)
            return cls(sock, str(reply["handle"]), mapping, got_rows, got_width)
        except BaseException:
            sock.close()
            raise

    def read(self, n: int) -> np.ndarray:
        """A ``(n, width)`` float32 copy of the first ``n`` rows (one memcpy)."""
        if n > self.rows:
            raise ValueError(f"{n} rows asked from a segment of {self.rows}")
        view = np.frombuffer(self._map, dtype=np.float32, count=n * self.width, offset=HEADER)
        out = view.reshape(n, self.width).copy()
        del view
        return out

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
        self._sock.close()
