"""genlm serve is safe to run: loopback by default, a token for anything else, limits
that fail only the offending client, and misbehaving clients (malformed frames,
disconnecting mid-batch, never reading), a restarting server and a killed client that
corrupt nobody's rows, leak no shared memory and hang no caller.

Every server here is a subprocess on a free loopback port; all traffic is loopback,
bounded in count, and every wait has a generous limit. Oracle for rows: the mock backend
computed in this process."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
import torch
from genlm_remote.connection import ServerBusy

import genlm_core
from genlm_core.serve import frame
from genlm_core.serve.testing import ServerProcess

TOKEN = "t0ken-for-tests-0123456789"
CTXS = [[1, 2, 3], [9, 8], [100, 200, 300, 400]]


@pytest.fixture(scope="module")
def oracle():
    llm = genlm_core.load("mock")
    yield llm
    llm.close()


def _post(
    url: str, path: str, body: bytes, token: str | None = None, timeout: float = 60
) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    headers = {"Content-Type": frame.MEDIA_TYPE}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _check_rows(llm, oracle) -> None:
    assert torch.equal(llm.batch_next_token_logprobs_sync(CTXS), oracle.batch_next_token_logprobs_sync(CTXS))


def test_a_public_bind_without_a_token_refuses_to_start() -> None:
    """Checked before the model loads and before any socket is opened."""
    out = subprocess.run(
        [sys.executable, "-m", "genlm_core.tools.cli", "serve", "mock", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "without a token" in out.stderr, out.stderr
    short = subprocess.run(
        [
            sys.executable,
            "-m",
            "genlm_core.tools.cli",
            "serve",
            "mock",
            "--host",
            "0.0.0.0",
            "--token",
            "short",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert short.returncode == 2 and "at least 16 characters" in short.stderr


def test_token_is_required_when_set(oracle) -> None:
    with ServerProcess("mock", args=["--token", TOKEN]) as srv:
        with pytest.raises(PermissionError, match="token"):
            genlm_core.load("remote", url=srv.url)
        with pytest.raises(PermissionError):
            genlm_core.load("remote", url=srv.url, token="wrong-token-wrong-token")
        status, _ = _post(srv.url, "/v1/logprobs", frame.encode_contexts([[1]]))
        assert status == 401
        llm = genlm_core.load("remote", url=srv.url, token=TOKEN)
        try:
            _check_rows(llm, oracle)
        finally:
            llm.close()


def test_limits_fail_the_offending_request_only(oracle) -> None:
    args = ["--max-batch", "4", "--max-context-length", "8", "--max-body-bytes", "4096"]
    with ServerProcess("mock", args=args) as srv:
        llm = genlm_core.load("remote", url=srv.url, cache_size=0)
        try:
            assert llm.max_context_length == 8
            with pytest.raises(ValueError):  # the client knows the server's limit
                llm.next_token_logprobs_sync(list(range(9)))
            status, body = _post(srv.url, "/v1/logprobs", frame.encode_contexts([list(range(9))]))
            assert status == 400 and b"more than the server's limit of 8" in body
            assert b"a larger --max-context-length" in body  # the option that sets it, and the fix
            status, body = _post(srv.url, "/v1/logprobs", frame.encode_contexts([[1]] * 5))
            assert status == 400 and b"above the limit 4" in body
            status, body = _post(srv.url, "/v1/logprobs", b"GLMF" + bytes(5000))
            assert status == 413 and b"limit of 4096" in body
            status, body = _post(srv.url, "/v1/logprobs", frame.encode_contexts([[10**6]]))
            assert status == 400 and str(10**6) in json.loads(body)["error"], body  # names the bad id
            # the client splits a batch larger than the server's limit: same rows
            many = [[i + 1, 3] for i in range(10)]
            assert torch.equal(
                llm.batch_next_token_logprobs_sync(many), oracle.batch_next_token_logprobs_sync(many)
            )
            _check_rows(llm, oracle)
        finally:
            llm.close()


def test_concurrency_limit_is_a_clear_busy_error() -> None:
    with ServerProcess("mock", opts={"work_s": 2.0}, args=["--max-concurrent-requests", "1"]) as srv:
        llm = genlm_core.load("remote", url=srv.url, cache_size=0)
        other = genlm_core.load("remote", url=srv.url, cache_size=0)
        try:
            first = threading.Thread(target=llm.next_token_logprobs_sync, args=([1, 2],))
            first.start()
            deadline = time.monotonic() + 60
            while llm.engine.server_stats()["inflight_requests"] < 1 and time.monotonic() < deadline:
                time.sleep(0.02)  # stats are not counted: this is the slow request
            with pytest.raises(ServerBusy, match="limit of 1 concurrent"):
                other.next_token_logprobs_sync([3])
            first.join(timeout=120)
            assert not first.is_alive()
            assert other.next_token_logprobs_sync([3]).shape == (len(other.byte_vocab),)
        finally:
            llm.close()
            other.close()


def test_misbehaving_clients_do_not_disturb_others(oracle) -> None:
    """Garbage frames, truncated frames, a client that disconnects mid-batch and a client
    that pipelines requests and never reads their (large) answers: meanwhile a good
    client gets exactly its rows, within a bounded time, and the server stays healthy."""
    with ServerProcess("mock", opts={"work_s": 0.02}) as srv:
        parts = urllib.parse.urlsplit(srv.url)
        good = genlm_core.load("remote", url=srv.url, cache_size=0)
        try:
            valid = frame.encode_contexts([[5, 6]])
            for bad in (b"", b"garbage", valid[:-3], valid + b"x", valid[:10]):
                status, body = _post(srv.url, "/v1/logprobs", bad)
                assert status == 400 and json.loads(body)["error"], body
            # disconnects mid-batch: request sent, socket closed before the answer
            head = (
                f"POST /v1/logprobs HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
                f"Content-Type: {frame.MEDIA_TYPE}\r\nContent-Length: %d\r\n\r\n"
            ).encode()
            for _ in range(5):
                s = socket.create_connection((parts.hostname, parts.port), timeout=30)
                body = frame.encode_contexts([[7, i] for i in range(32)])
                s.sendall(head % len(body) + body)
                s.close()
            # never reads: 30 pipelined requests of 64 rows (~120 KB each), answers never read
            lazy = socket.create_connection((parts.hostname, parts.port), timeout=30)
            lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            big = frame.encode_contexts([[8, i] for i in range(64)])
            request = head % len(big) + big
            try:
                lazy.sendall(request * 30)
            except OSError:
                pass  # the server stopped reading from it: that is the point
            start = time.monotonic()
            for _ in range(5):
                _check_rows(good, oracle)
            assert time.monotonic() - start < 120  # bounded; typically well under a second
            stats = good.engine.server_stats()
            assert stats["errors"].get("400", 0) >= 5
            lazy.close()
            assert good.healthy
            _check_rows(good, oracle)
        finally:
            good.close()


def test_server_restart_fails_calls_fast_then_recovers(oracle) -> None:
    """A call while the server is down is a ConnectionError (not a hang); once a server is
    back on the same address the same client works again (through frames: the segment of
    the server that went away went with it)."""
    srv = ServerProcess("mock").start()
    port = urllib.parse.urlsplit(srv.url).port
    llm = genlm_core.load("remote", url=srv.url, cache_size=0, request_timeout_s=60)
    try:
        _check_rows(llm, oracle)
        assert llm.engine.transport == "shm" and llm.stats()["transport"]["segments"] == 1
        assert srv.stop() == 0  # graceful: exit status 0
        start = time.monotonic()
        with pytest.raises(ConnectionError):
            llm.next_token_logprobs_sync([4, 2])
        assert time.monotonic() - start < 60
        assert llm.stats()["transport"]["segments"] == 0  # dropped with the failed call
        srv = ServerProcess("mock", port=port).start()
        _check_rows(llm, oracle)
        assert llm.stats()["transport"]["replies"]["shm"] >= 1
    finally:
        llm.close()
        srv.stop()


def test_graceful_shutdown_answers_in_flight_requests(oracle) -> None:
    srv = ServerProcess("mock", opts={"work_s": 1.0}).start()
    llm = genlm_core.load("remote", url=srv.url, cache_size=0)
    got: list = []
    try:
        t = threading.Thread(target=lambda: got.append(llm.next_token_logprobs_sync([1, 2, 3])))
        t.start()
        deadline = time.monotonic() + 60
        while llm.engine.server_stats()["inflight_requests"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.stop() == 0
        t.join(timeout=120)
        assert got and torch.equal(got[0], oracle.next_token_logprobs_sync([1, 2, 3]))
    finally:
        llm.close()
        srv.stop()


def test_a_killed_client_leaves_nothing_behind(oracle) -> None:
    """A client killed with SIGKILL runs no close(): the kernel closes its segment socket,
    the server drops the segment (its memory freed), nothing was ever created in
    /dev/shm, and the next client is served through a segment of its own."""
    with ServerProcess("mock") as srv:
        code = (
            "import genlm_core, sys\n"
            f"llm = genlm_core.load('remote', url={srv.url!r})\n"
            "llm.next_token_logprobs_sync([1, 2])\n"
            "print(llm.stats()['transport']['replies']['shm'], flush=True)\n"
            "sys.stdin.read()\n"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        probe = genlm_core.load("remote", url=srv.url, transport="frame")
        try:
            assert child.stdout.readline().strip() == "1"
            assert probe.engine.server_stats()["shm"]["segments"] == 1
        finally:
            child.kill()
            child.wait(timeout=60)
        try:
            deadline = time.monotonic() + 60
            while probe.engine.server_stats()["shm"]["segments"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert probe.engine.server_stats()["shm"]["segments"] == 0
            assert [n for n in os.listdir("/dev/shm") if str(child.pid) in n] == []
            llm = genlm_core.load("remote", url=srv.url)
            try:
                _check_rows(llm, oracle)
                assert llm.stats()["transport"]["replies"]["shm"] == 1
            finally:
                llm.close()
        finally:
            probe.close()
