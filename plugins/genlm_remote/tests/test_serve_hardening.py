"""genlm serve against a hostile local client, a browser page and a careless operator:
it never writes through a path a client names, slow bodies hold nothing, malformed input
is a 400 naming the field, tokens need the Bearer scheme and stay off the command line,
foreign Hosts and Origins are refused, requests have a token budget.

Every server is a `genlm serve mock` subprocess on a free loopback port; every wait is
bounded (generously: the machine may be busy) and no assert depends on speed. Oracle for
rows: the mock computed in this process."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch
from serve_http import host_port, post_json, read_status, request, stalled_body

import genlm_core
from genlm_core.serve import frame
from genlm_core.serve.testing import ServerProcess

TOKEN = "t0ken-for-tests-0123456789"


@pytest.fixture(scope="module")
def server():
    with ServerProcess("mock", opts={"max_context_length": 64}) as srv:
        yield srv


@pytest.fixture(scope="module")
def oracle():
    llm = genlm_core.load("mock", max_context_length=64)
    yield llm
    llm.close()


def _stats(url: str, **kw) -> dict:
    status, body = request(url, "GET", "/v1/stats", **kw)
    assert status == 200, body
    return json.loads(body)


# ---------------------------------------------------------------- 1: client-named paths
def test_a_symlink_planted_in_dev_shm_is_never_followed(server) -> None:
    """A client names a /dev/shm 'buffer' that is a symlink to a file whose first 16
    bytes it knows (the nonce check of a client-owned buffer): the server answers with
    the rows in the frame and the file is untouched. A regular file it planted there is
    not opened either, and a guessed segment handle gets the frame too."""
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(b"root:x:0:0:root:" + bytes(range(256)) * 64)
        target = f.name
    with open(target, "rb") as f:
        original = f.read()
    name = f"genlm-remote-{os.getpid()}-planted"
    link = f"/dev/shm/{name}"
    plain = f"/dev/shm/{name}-plain"
    try:
        os.symlink(target, link)
        with open(plain, "wb") as f:
            f.write(original)
        for victim in (name, name + "-plain"):
            body = frame.encode_contexts([[1, 2, 3]])
            # an old client's header: {"name", "nonce", "capacity"}
            head = {
                "n": 1,
                "uncached": False,
                "shm": {"name": victim, "nonce": original[:16].hex(), "capacity": 4000},
            }
            raw = json.dumps(head, separators=(",", ":")).encode()
            raw += b" " * (-len(raw) % 8)
            payload = body[frame.PREFIX_LEN + int.from_bytes(body[8:12], "little") :]
            forged = frame._PREFIX.pack(frame.MAGIC, frame.VERSION, frame.CONTEXTS, len(raw), 0, len(payload))
            status, reply = request(server.url, "POST", "/v1/logprobs", forged + raw + payload)
            assert status == 200, reply
            assert frame.decode_rows(reply).transport == "frame"
        with open(target, "rb") as f:
            assert f.read() == original
        with open(plain, "rb") as f:
            assert f.read() == original
        guessed = frame.encode_contexts([[1, 2, 3]], shm=["0" * 32])
        status, reply = request(server.url, "POST", "/v1/logprobs", guessed)
        assert status == 200 and frame.decode_rows(reply).transport == "frame"
    finally:
        for path in (link, plain, target):
            if os.path.lexists(path):
                os.unlink(path)


def _segment_fds() -> list[int]:
    """This process's descriptors of segments a server handed it (memfds by their name)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if "memfd:genlm-serve-rows" in os.readlink(f"/proc/self/fd/{name}"):
                out.append(int(name))
        except OSError:
            pass
    return out


def test_a_client_cannot_resize_its_segment_under_the_server(server, oracle) -> None:
    """The segment's descriptor is read-only and sealed: a client that reopens it for
    writing still cannot truncate it (a server writing into a truncated mapping would
    die of SIGBUS); the server keeps answering, through the segment."""
    before = set(_segment_fds())
    llm = genlm_core.load("remote", url=server.url, cache_size=0)
    try:
        assert llm.engine.transport == "shm" and llm.info()["shm_segments"] == 1
        fds = set(_segment_fds()) - before
        assert len(fds) == 1
        fd = fds.pop()
        with pytest.raises(OSError):
            os.ftruncate(fd, 0)  # opened read-only
        try:
            rw = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        except PermissionError:
            rw = None  # cannot even reopen it for writing
        if rw is not None:
            try:
                with pytest.raises(PermissionError):
                    os.ftruncate(rw, 0)  # F_SEAL_SHRINK
                with pytest.raises(PermissionError):
                    os.ftruncate(rw, 1 << 40)  # F_SEAL_GROW
            finally:
                os.close(rw)
        assert torch.equal(llm.next_token_logprobs_sync([4, 5]), oracle.next_token_logprobs_sync([4, 5]))
        assert llm.stats()["transport"]["replies"]["shm"] == 1
    finally:
        llm.close()


# ---------------------------------------------------------------- 2: stalled bodies
def test_stalled_bodies_hold_no_slot(oracle) -> None:
    """64 connections send headers and 10 of 40 body bytes, then stall: they are not in
    flight (a request is, once its body is read), so a good client gets its rows."""
    with ServerProcess("mock") as srv:
        stalled = [stalled_body(srv.url) for _ in range(64)]
        try:
            llm = genlm_core.load("remote", url=srv.url, cache_size=0)
            try:
                for i in range(3):
                    ctx = [7, i, 9]
                    assert torch.equal(
                        llm.next_token_logprobs_sync(ctx), oracle.next_token_logprobs_sync(ctx)
                    )
                stats = llm.engine.server_stats()
                assert stats["inflight_requests"] == 0 and stats["open_requests"] == 64
            finally:
                llm.close()
        finally:
            for s in stalled:
                s.close()


def test_a_stalled_body_is_answered_408_after_its_timeout() -> None:
    with ServerProcess("mock", args=["--body-timeout-s", "2"]) as srv:
        stalled = [stalled_body(srv.url) for _ in range(8)]
        try:
            assert {read_status(s) for s in stalled} == {408}  # each after its 2 s (+ the machine)
            assert _stats(srv.url)["open_requests"] == 0
        finally:
            for s in stalled:
                s.close()


def test_a_body_is_dropped_after_an_idle_gap_not_while_its_bytes_keep_coming(oracle) -> None:
    """The idle gap counts between reads (as nginx's client_body_timeout): a body that
    stops gets 408 naming --body-idle-s once no byte came for that long, long before the
    whole-body timeout; a body sent a byte at a time, 0.05 s apart, for longer than the
    gap is read and answered."""
    with ServerProcess("mock", args=["--body-idle-s", "3", "--body-timeout-s", "600"]) as srv:
        host, port = host_port(srv.url)
        started = time.monotonic()
        stalled = stalled_body(srv.url, sent=1, declared=40)
        try:
            stalled.settimeout(300)
            data = b""
            while chunk := stalled.recv(4096):
                data += chunk
            waited = time.monotonic() - started
        finally:
            stalled.close()
        assert data.startswith(b"HTTP/1.1 408 ") and b"--body-idle-s" in data, data
        assert 2.9 <= waited < 300, waited  # the gap, not the 600 s whole-body timeout
        body = frame.encode_contexts([[4, 5, 6]])
        conn = http.client.HTTPConnection(host, port, timeout=300)
        try:
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.putrequest("POST", "/v1/logprobs")
            conn.putheader("Content-Type", frame.MEDIA_TYPE)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders()
            for i in range(len(body)):  # ~90 bytes over ~4.5 s: longer than the gap
                conn.send(body[i : i + 1])
                time.sleep(0.05)
            reply = conn.getresponse()
            rows = reply.read()
            assert reply.status == 200, rows
        finally:
            conn.close()
        assert torch.equal(
            torch.from_numpy(frame.decode_rows(rows).rows[0]), oracle.next_token_logprobs_sync([4, 5, 6])
        )
        assert _stats(srv.url)["bodies"]["dropped"] == {"idle": 1}


def _loopback_sources() -> list[str]:
    """127.0.0.1 .. 127.0.0.254 where all of 127.0.0.0/8 is this machine (Linux), else 127.0.0.1."""
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.2", 0))
    except OSError:
        return ["127.0.0.1"]
    finally:
        probe.close()
    return [f"127.0.0.{i}" for i in range(1, 255)]


def test_stalled_bodies_from_any_loopback_address_never_keep_a_request_out(oracle) -> None:
    """500 connections send headers and 1 byte of their body, then stall: 130 from
    127.0.0.1 (they filled its per-address cap of 128: every other local client got 503
    for the whole body timeout, renewable), the rest from 127.0.0.2..254 (a client picks
    any loopback address). What is read at once is capped over all clients (256 bodies),
    each new request taking the place of the idlest: a client that sends its body is
    answered at once, and every stalled connection gets 408 (dropped to make room, or
    after the idle gap)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:  # the sockets here and the server's (a subprocess: it inherits the limit)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1200, hard), hard))
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    n = min(500, max(limit - 300, limit // 4))  # 500 where the descriptors allow
    args = [] if n > 300 else ["--max-open-bodies", str(n // 2)]  # fewer descriptors: the cap still bites
    sources = _loopback_sources()
    stalled = []
    try:
        with ServerProcess("mock", args=args) as srv:
            for i in range(n):
                source = "127.0.0.1" if i < 130 else sources[i % len(sources)]
                stalled.append(stalled_body(srv.url, sent=1, declared=40, source=source))
            deadline = time.monotonic() + 120
            while _stats(srv.url)["requests"].get("logprobs", 0) < n:  # the server has seen them all
                assert time.monotonic() < deadline, _stats(srv.url)
                time.sleep(0.05)
            for source in ("127.0.0.1", sources[-1]):
                started = time.monotonic()
                status, body = request(
                    srv.url, "POST", "/v1/logprobs", frame.encode_contexts([[1, 2, 3]]), source=source
                )
                answered = time.monotonic() - started
                assert status == 200, (source, status, body)
                assert torch.equal(
                    torch.from_numpy(frame.decode_rows(body).rows[0]),
                    oracle.next_token_logprobs_sync([1, 2, 3]),
                )
                assert answered < 10, f"answered in {answered:.2f} s with {n} stalled bodies"
                print(f"{n} stalled bodies: a request from {source} answered in {answered:.3f} s")
            bodies = _stats(srv.url)["bodies"]
            cap = 256 if n > 300 else n // 2
            assert bodies["open"] <= cap and bodies["open"] + sum(bodies["dropped"].values()) == n, bodies
            statuses = {read_status(s) for s in stalled}  # each within the idle gap (10 s) + the machine
            assert statuses == {408}, statuses
            bodies = _stats(srv.url)["bodies"]
            assert bodies["open"] == 0 and sum(bodies["dropped"].values()) == n, bodies
    finally:
        for s in stalled:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_one_clients_requests_in_computation_are_capped_others_served(oracle) -> None:
    """A client (peer address 127.0.0.2) with its limit of requests being computed gets a
    503 naming the per-client limit for one more; a client at 127.0.0.1 is served. Its
    stalled bodies do not count (what is read is capped over all clients)."""
    args = ["--max-requests-per-client", "2", "--body-timeout-s", "600", "--body-idle-s", "600"]
    with ServerProcess("mock", opts={"work_s": 5.0}, args=args) as srv:
        stalled = [stalled_body(srv.url, source="127.0.0.2") for _ in range(4)]
        got: dict[int, tuple[int, bytes]] = {}

        def ask(i: int) -> None:
            got[i] = request(
                srv.url, "POST", "/v1/logprobs", frame.encode_contexts([[i + 1, 9]]), source="127.0.0.2"
            )

        slow = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        try:
            deadline = time.monotonic() + 60
            while _stats(srv.url)["bodies"]["open"] < 4:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            for t in slow:
                t.start()
            while _stats(srv.url)["inflight_requests"] < 2:  # both computing (5 s a pass)
                assert time.monotonic() < deadline
                time.sleep(0.02)
            status, body = request(
                srv.url, "POST", "/v1/logprobs", frame.encode_contexts([[1]]), source="127.0.0.2"
            )
            assert status == 503 and b"--max-requests-per-client" in body, body
            status, body = request(srv.url, "POST", "/v1/logprobs", frame.encode_contexts([[1]]))
            assert status == 200 and torch.equal(
                torch.from_numpy(frame.decode_rows(body).rows[0]), oracle.next_token_logprobs_sync([1])
            )
            for t in slow:
                t.join(300)
            assert [got[i][0] for i in range(2)] == [200, 200], got
            assert _stats(srv.url)["rejections"]["client_limit"] == {"127.0.0.2": 1}
            status, body = request(
                srv.url, "POST", "/v1/logprobs", frame.encode_contexts([[2]]), source="127.0.0.2"
            )
            assert status == 200, body  # its 4 stalled bodies still open
            assert _stats(srv.url)["bodies"]["open"] == 4
        finally:
            for s in stalled:
                s.close()


# ---------------------------------------------------------------- 3: token budget
def test_a_request_above_the_token_budget_is_a_413_naming_the_flag() -> None:
    with ServerProcess("mock", args=["--max-request-tokens", "100"]) as srv:
        ctxs = [list(range(1, 60))] * 2
        status, body = request(srv.url, "POST", "/v1/logprobs", frame.encode_contexts(ctxs))
        assert status == 413 and b"--max-request-tokens" in body and b"118 tokens" in body, body
        status, body = post_json(srv.url, "/v1/sample", {"prompts": [[1, 2]] * 4, "max_tokens": 30})
        assert status == 413 and "--max-request-tokens" in body["error"], body
        ctxs = [list(range(1, 50))] * 2
        assert request(srv.url, "POST", "/v1/logprobs", frame.encode_contexts(ctxs))[0] == 200  # 98: within


# ---------------------------------------------------------------- 4: text limit
def test_tokenize_has_a_text_limit(server) -> None:
    status, body = post_json(server.url, "/v1/tokenize", {"text": "a" * (1 << 20 + 1)})
    assert status == 413 and "--max-text-bytes" in body["error"], body
    status, body = post_json(server.url, "/v1/tokenize", {"text": "hello"})
    assert status == 200 and body["ids"]


def test_tokenize_refuses_a_lone_surrogate_naming_it() -> None:
    """The JSON string "\\ud800" is no character: a Rust tokenizer raised TypeError on it
    (HTTP 500); it is a 400 naming the field and the code point, and an escaped
    surrogate pair (one character) is tokenized."""
    from genlm_core.testing.models import tiny_llama

    with ServerProcess("mock", model=str(tiny_llama())) as srv:  # the model lends its HF tokenizer
        for raw in (b'{"text": "\\ud800"}', b'{"text": "a\\ud800b"}', b'{"text": "\\udc00"}'):
            status, body = request(srv.url, "POST", "/v1/tokenize", raw)
            assert status == 400, (raw, status, body)
            error = json.loads(body)["error"]
            assert "field 'text'" in error and "lone surrogate U+D" in error, error
        status, body = post_json(srv.url, "/v1/tokenize", {"text": "\U0001f600 hi"})
        assert status == 200 and body["ids"], body


# ---------------------------------------------------------------- 5: malformed sample bodies
@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"[" * 100000, "nested too deeply"),
        (b'{"prompts": [[1]], "max_tokens": 2, "eos_token_ids": 5}', "'eos_token_ids'"),
        (b'{"prompts": [[1]], "max_tokens": 2, "temperature": Infinity}', "Infinity"),
        (b'{"prompts": [[1]], "max_tokens": 2, "temperature": 1e999}', "'temperature'"),
        (b'{"prompts": [[1]], "max_tokens": 2, "seed": %d}' % 2**70, "'seed'"),
        (b'{"prompts": [[1, true]], "max_tokens": 2}', "'prompts.0.1'"),
        (b'{"prompts": [[1]], "max_tokens": -1}', "'max_tokens'"),
        (b'{"prompts": [[1]], "max_tokens": 2, "eos_token_ids": [99999999]}', "'eos_token_ids'"),
        (b'{"prompts": [[1]], "max_tokens": 2, "batch": "yes"}', "'batch'"),
        (b'{"prompts": [[1]], "max_tokens": 2, "extra": 1}', "'extra'"),
    ],
)
def test_a_malformed_sample_body_is_a_400_naming_the_field(server, raw, field) -> None:
    status, body = request(server.url, "POST", "/v1/sample", raw)
    assert status == 400, (status, body)
    assert field in json.loads(body)["error"], body


def test_the_seed_bound_counts_every_prompt(server) -> None:
    """Prompt i samples with seed + i: the largest seed of a two-prompt request is one less."""
    payload = {"prompts": [[1], [2]], "max_tokens": 1, "seed": 2**63 - 1}
    status, body = post_json(server.url, "/v1/sample", payload)
    assert status == 400 and "'seed'" in body["error"], body
    status, body = post_json(server.url, "/v1/sample", {**payload, "seed": 2**63 - 2})
    assert status == 200, body


# ---------------------------------------------------------------- 6, 7: the token
def test_the_bearer_scheme_is_required_in_any_case() -> None:
    with ServerProcess("mock", env={"GENLM_SERVE_TOKEN": TOKEN}) as srv:
        ctx = frame.encode_contexts([[1]])
        for auth, want in ((TOKEN, 401), (f"Token {TOKEN}", 401), (f"bearer {TOKEN}", 200),
                           (f"BEARER {TOKEN}", 200), (f"Bearer {TOKEN}x", 401)):  # fmt: skip
            status, body = request(srv.url, "POST", "/v1/logprobs", ctx, headers={"Authorization": auth})
            assert status == want, (auth, body)
        status, _ = request(srv.url, "GET", "/v1/health")
        assert status == 200  # health needs no token
        for path in ("/v1/stats", "/metrics", "/v1/info"):
            assert request(srv.url, "GET", path)[0] == 401


def test_the_token_comes_from_the_environment_or_a_file_and_warns_on_the_command_line(tmp_path) -> None:
    help_text = subprocess.run(
        [sys.executable, "-m", "genlm_core.tools.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert "GENLM_SERVE_TOKEN" in help_text and "--token-file" in help_text
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "genlm_core.tools.cli",
            "serve",
            "mock",
            "--port",
            "0",
            "--token-file",
            str(token_file),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "chmod 600" in out.stderr, out.stderr
    token_file.chmod(0o600)
    with ServerProcess("mock", args=["--token-file", str(token_file)]) as srv:
        with pytest.raises(PermissionError):
            genlm_core.load("remote", url=srv.url)
        llm = genlm_core.load("remote", url=srv.url, token=TOKEN)
        assert (
            llm.engine.transport == "shm" and llm.info()["shm_segments"] == 1
        )  # the segment socket wants it too
        llm.close()
    with ServerProcess("mock", args=["--token", TOKEN]) as srv:
        assert "visible to every user" in srv.stderr


# ---------------------------------------------------------------- 8: browsers
def test_foreign_host_origin_and_media_type_are_refused(server, oracle) -> None:
    """What a web page can make a browser send: a rebinding attack (the attacker's Host),
    a simple cross-origin POST (text/plain, a foreign Origin), a preflight. None reaches
    a handler: the server's caches survive a refused clear_cache."""
    llm = genlm_core.load("remote", url=server.url)
    try:
        llm.next_token_logprobs_sync([42, 43])
        entries = llm.engine.server_stats()["backend"]["output_cache"]["entries"]
        assert entries >= 1
        ctx = frame.encode_contexts([[1]])
        evil = "http://attacker.example.com"
        cases = [
            ("POST", "/v1/logprobs", ctx, {"Host": "attacker.example.com"}, 403),
            ("POST", "/v1/clear_cache", b"{}", {"Host": "attacker.example.com", "Origin": evil}, 403),
            ("POST", "/v1/clear_cache", b"{}", {"Origin": evil}, 403),
            ("POST", "/v1/clear_cache", b"{}", {"Content-Type": "text/plain"}, 415),
            ("POST", "/v1/logprobs", ctx, {"Content-Type": "text/plain"}, 415),
            ("POST", "/v1/logprobs", ctx, {"Origin": "null"}, 403),
            ("GET", "/v1/stats", None, {"Host": "attacker.example.com:8765"}, 403),
            ("GET", "/v1/health", None, {"Host": "attacker.example.com"}, 403),
            ("OPTIONS", "/v1/logprobs", None, {"Origin": evil, "Access-Control-Request-Method": "POST"}, 403),
        ]
        for method, path, body, headers, want in cases:
            status, reply = request(server.url, method, path, body, headers=headers)
            assert status == want, (method, path, headers, status, reply)
            assert json.loads(reply)["type"], reply
        assert llm.engine.server_stats()["backend"]["output_cache"]["entries"] == entries  # not cleared
        port = server.url.rsplit(":", 1)[1]
        for host in (f"localhost:{port}", f"[::1]:{port}", f"127.0.0.1:{port}", "LOCALHOST"):
            status, reply = request(server.url, "POST", "/v1/logprobs", ctx, headers={"Host": host})
            assert status == 200, (host, reply)
        own = {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"}
        assert request(server.url, "POST", "/v1/logprobs", ctx, headers=own)[0] == 200
        assert llm.engine.server_stats()["rejections"]["HostNotAllowed"]["127.0.0.1"] >= 3
    finally:
        llm.close()


def test_a_host_header_is_parsed_whole(server) -> None:
    """A Host that starts with an allowed name and goes on (a port that is not a number,
    userinfo, text after ']', empty labels) is a 403 naming the fault, not the name it
    started with."""
    port = server.url.rsplit(":", 1)[1]
    ctx = frame.encode_contexts([[1]])
    for host in ("localhost:evil.com", f"localhost:{port}@evil.com", "[::1]evil.com", "localhost..",
                 f"[::1]evil.com:{port}", f"127.0.0.1:{port}:80"):  # fmt: skip
        for method, path, body in (("GET", "/v1/stats", None), ("POST", "/v1/logprobs", ctx)):
            status, reply = request(server.url, method, path, body, headers={"Host": host})
            assert status == 403, (host, path, status, reply)
            error = json.loads(reply)
            assert error["type"] == "HostNotAllowed" and "HOST[:PORT]" in error["error"], error
    for host in (f"localhost:{port}", f"[::1]:{port}", "localhost.", f"LOCALHOST.:{port}"):
        assert request(server.url, "POST", "/v1/logprobs", ctx, headers={"Host": host})[0] == 200, host


def test_two_host_headers_are_a_bad_request(server) -> None:
    """A request carrying two Host headers (the server's name, then another) is answered
    400 (RFC 7230 section 5.4), on every endpoint, before any handler runs."""
    port = server.url.rsplit(":", 1)[1]
    ctx = frame.encode_contexts([[1]])
    for method, path, body in (("GET", "/v1/stats", b""), ("POST", "/v1/logprobs", ctx)):
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.com\r\n"
            f"Content-Type: {frame.MEDIA_TYPE}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        with socket.create_connection(host_port(server.url), timeout=30) as sock:
            sock.sendall(head.encode() + body)
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        status_line = reply.split(b"\r\n", 1)[0].decode()
        assert status_line.split()[1] == "400", (path, reply[:300])
        assert b"Host" in reply.split(b"\r\n\r\n", 1)[1], reply


def test_allow_host_adds_a_name() -> None:
    with ServerProcess("mock", args=["--allow-host", "genlm.internal"]) as srv:
        ctx = frame.encode_contexts([[1]])
        assert request(srv.url, "POST", "/v1/logprobs", ctx, headers={"Host": "genlm.internal:1"})[0] == 200
        assert request(srv.url, "POST", "/v1/logprobs", ctx, headers={"Host": "other.internal"})[0] == 403


# ---------------------------------------------------------------- 6: /metrics
def test_metrics_are_prometheus_text_counting_every_forward_pass(oracle) -> None:
    """Three requests, one after the other, of 1, 3 and 5 new contexts: the server runs
    one forward pass for each (nothing else is asking), so rows per pass are exactly
    {1, 3, 5}; one cached context answers from the output cache (a hit)."""
    from prometheus_client.parser import text_string_to_metric_families

    with ServerProcess("mock", env={"GENLM_SERVE_TOKEN": TOKEN}, args=["--gather-ms", "0"]) as srv:
        llm = genlm_core.load("remote", url=srv.url, token=TOKEN, cache_size=0)
        try:
            for k in (1, 3, 5):
                ctxs = [[k, i] for i in range(k)]
                assert torch.equal(
                    llm.batch_next_token_logprobs_sync(ctxs), oracle.batch_next_token_logprobs_sync(ctxs)
                )
            llm.next_token_logprobs_sync([1, 0])  # computed before: the server's cache
        finally:
            llm.close()
        assert request(srv.url, "GET", "/metrics")[0] == 401
        status, body = request(srv.url, "GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        rows = {s.name.rsplit("_", 1)[1]: s for s in fams["genlm_serve_forward_rows"].samples}
        assert rows["count"].value == 3 and rows["sum"].value == 9
        buckets = {
            s.labels["le"]: s.value for s in fams["genlm_serve_forward_rows"].samples if "le" in s.labels
        }
        assert buckets["1.0"] == 1 and buckets["2.0"] == 1 and buckets["4.0"] == 2 and buckets["8.0"] == 3
        hits = {s.labels["cache"]: s.value for s in fams["genlm_serve_cache_hits"].samples}
        assert hits["output_cache"] == 1
        requests = {s.labels["endpoint"]: s.value for s in fams["genlm_serve_requests"].samples}
        assert requests["logprobs"] == 4
        latency = [s for s in fams["genlm_serve_request_seconds"].samples if s.name.endswith("_count")]
        assert {s.labels["endpoint"]: s.value for s in latency}["logprobs"] == 4
        for name in ("genlm_serve_queue_depth", "genlm_serve_inflight_requests", "genlm_serve_rejections",
                     "genlm_serve_phase_seconds"):  # fmt: skip
            assert name in fams


def test_a_round_trip_is_accounted_phase_by_phase() -> None:
    """The server's stamps and the client's tile each round trip: their phases sum to
    it, and the forward pass (the mock sleeps 0.3 s in it) is in 'computing'."""
    with ServerProcess("mock", opts={"work_s": 0.3}) as srv:
        llm = genlm_core.load("remote", url=srv.url, cache_size=0)
        try:
            start = time.monotonic()
            for i in range(3):
                llm.next_token_logprobs_sync([i + 1, 2])
            wall = time.monotonic() - start
            timing = llm.stats()["transport"]["timing"]
            assert timing["round_trips"] == 3
            parts = timing["seconds"]
            assert all(v >= 0 for v in parts.values()), parts
            assert sum(parts.values()) <= wall
            assert parts["computing"] >= 3 * 0.3  # each pass sleeps 0.3 s
            server = llm.engine.server_stats()
            assert server["phases"]["computing"]["count"] == 3 and server["phases"]["computing"]["sum"] >= 0.9
            assert server["forward"]["passes"] == 3 and server["forward"]["busy_s"] >= 0.9
        finally:
            llm.close()


def test_the_segment_socket_refuses_beyond_its_caps() -> None:
    """One client process holds at most PER_PROCESS segments of a server: the next
    client in it gets its rows in frames, and says why."""
    from genlm_core.serve import shm

    with ServerProcess("mock") as srv:
        clients = [genlm_core.load("remote", url=srv.url) for _ in range(shm.PER_PROCESS + 1)]
        try:
            held = [c.info()["shm_segments"] for c in clients]
            assert held == [1] * shm.PER_PROCESS + [0], held
            assert "process_limit" in clients[-1].engine.shm_problem
            assert clients[-1].next_token_logprobs_sync([3]).shape == (len(clients[-1].byte_vocab),)
            assert clients[-1].stats()["transport"]["replies"] == {"shm": 0, "frame": 1}
            assert _stats(srv.url)["shm"]["refused"] == {"process_limit": 1}
        finally:
            for c in clients:
                c.close()
