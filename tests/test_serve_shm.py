"""Segments the server creates (genlm_core.serve.shm), without HTTP: rows written by the
server are read bit for bit by the client; the descriptor is read-only and sealed; the
caps, the token and a wrong peer refuse a segment; a closed client's segment is dropped.
The server side runs on an event loop in a thread; every wait is bounded."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from genlm_core.serve import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="memfd and descriptor passing: Linux only")

WIDTH, ROWS = 50, 4
TOKEN = "0123456789abcdef-token"


class _Server:
    def __init__(self, **kw) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = shm.SegmentServer(WIDTH, ROWS, kw.pop("max_segments", 8), kw.pop("token", None), **kw)
        self.address = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(60)

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 60
        while len(self.server.segments) != count:
            assert time.monotonic() < deadline, self.server.stats()
            time.sleep(0.01)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(60)


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    yield srv
    srv.close()


def test_rows_round_trip_bit_for_bit_through_a_sealed_read_only_segment(server) -> None:
    seg = shm.ClientSegment.request(server.address, ROWS, WIDTH, None, os.getpid())
    try:
        server.wait_for(1)
        rows = np.random.default_rng(0).standard_normal((3, WIDTH)).astype(np.float32)
        assert server.server.write(["f" * 32, seg.handle], list(rows)) == seg.handle  # the one it holds
        assert seg.read(3).tobytes() == rows.tobytes()
        assert (
            server.server.write([seg.handle], list(np.zeros((ROWS + 1, WIDTH), np.float32))) is None
        )  # no room
        assert server.server.write(["0" * 32], list(rows)) is None  # not a handle it gave out
    finally:
        seg.close()
    server.wait_for(0)  # the client let it go: the server dropped its mapping
    assert server.server.write([seg.handle], list(rows)) is None


def test_the_segment_cannot_be_resized_by_either_side(server) -> None:
    seg = shm.ClientSegment.request(server.address, ROWS, WIDTH, None, None)
    try:
        fds = [
            int(n)
            for n in os.listdir("/proc/self/fd")
            if os.path.islink(f"/proc/self/fd/{n}")
            and os.readlink(f"/proc/self/fd/{n}").startswith("/memfd:genlm-serve-rows")
        ]
        assert fds
        for fd in fds:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW and seals & fcntl.F_SEAL_SEAL
    finally:
        seg.close()


def test_caps_token_and_peer_refuse_a_segment() -> None:
    one = shm.HEADER + ROWS * WIDTH * 4
    srv = _Server(token=TOKEN, max_bytes=2 * one)
    held = []
    try:
        with pytest.raises(ValueError, match="token"):
            shm.ClientSegment.request(srv.address, ROWS, WIDTH, None, None)
        with pytest.raises(ValueError, match="not the server's"):
            shm.ClientSegment.request(srv.address, ROWS, WIDTH, TOKEN, os.getpid() + 1)
        held += [shm.ClientSegment.request(srv.address, ROWS, WIDTH, TOKEN, None) for _ in range(2)]
        with pytest.raises(ValueError, match="server_bytes"):
            shm.ClientSegment.request(srv.address, ROWS, WIDTH, TOKEN, None)
        assert srv.server.stats()["refused"] == {"token": 1, "server_bytes": 1}
    finally:
        for seg in held:
            seg.close()
        srv.close()
    srv = _Server()
    try:
        held = [
            shm.ClientSegment.request(srv.address, ROWS, WIDTH, None, None) for _ in range(shm.PER_PROCESS)
        ]
        with pytest.raises(ValueError, match="process_limit"):
            shm.ClientSegment.request(srv.address, ROWS, WIDTH, None, None)
    finally:
        for seg in held:
            seg.close()
        srv.close()


def _exchange(address: str, raw: bytes) -> bytes:
    """The server's reply line to ``raw`` sent on its socket (b"" if it closed without one)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    try:
        s.connect("\0" + address[1:])
        s.sendall(raw)
        data = b""
        while b"\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data
    finally:
        s.close()


@pytest.mark.parametrize(
    ("raw", "fault"),
    [
        (b"[" * 4000 + b"\n", "nested too deeply"),  # was a RecursionError in a task nobody awaited
        (b"[1]\n", "must be a JSON object"),
        (b'{"rows": NaN}\n', "NaN is not a JSON number"),
        (b"{rows: 1}\n", "is not JSON"),
        (b"x" * 5000 + b"\n", "longer than 4096 bytes"),
    ],
)
def test_a_malformed_segment_request_is_refused_with_its_fault(server, raw, fault) -> None:
    """The socket answers a malformed request line with an error naming the fault (and
    the request it wants), logs no unretrieved task exception, and keeps serving."""
    seen: list[dict] = []
    server.loop.call_soon_threadsafe(server.loop.set_exception_handler, lambda loop, ctx: seen.append(ctx))
    reply = _exchange(server.address, raw)
    assert reply, "the server closed the socket without an answer"
    error = json.loads(reply)["error"]
    assert error.startswith("malformed: the segment request") and fault in error, error
    assert '{"rows": N}' in error, error
    assert server.server.stats()["refused"] == {"malformed": 1}
    seg = shm.ClientSegment.request(server.address, ROWS, WIDTH, None, None)  # still serving
    seg.close()
    gc.collect()  # a task that died with an exception nobody retrieved reports it when freed
    time.sleep(0.1)
    assert seen == [], seen
