"""genlm serve keeps its event loop free: health and stats are answered while a forward
pass runs (the pass is held on an event, so the test does not depend on timing), text is
tokenized off the loop, and a client that disconnects has its queued work dropped at the
next batch boundary.

The forward pass here is the real transformers engine (tiny Llama, float32 on the CPU,
where the hf backend computes on the event loop in a program of its own), held by a
forward pre-hook on its model; the server runs in this process (InProcessServer). Every
wait has a generous bound; a request that cannot be answered fails by its timeout."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import torch
from serve_http import post_json, request

import genlm_core
from genlm_core.serve import frame
from genlm_core.serve.app import build_app
from genlm_core.serve.testing import InProcessServer, ServerProcess
from genlm_core.testing.tolerance import assert_backend_close

# one context batched alone on the server vs the backend's uncached single pass: the same
# float32 arithmetic up to the order of a few sums: the derived bound
# (genlm_core.testing.tolerance)


def _in_thread(fn: Any, *args: Any, **kw: Any) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kw)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_health_and_stats_answer_while_a_forward_pass_runs(tiny_llama_path) -> None:
    llm = genlm_core.load("hf", model=str(tiny_llama_path), dtype="float32", device="cpu")
    entered, release = threading.Event(), threading.Event()

    def hold(module: Any, args: Any) -> None:
        entered.set()
        release.wait(300)

    hook = llm.model.register_forward_pre_hook(hold)
    try:
        with InProcessServer(build_app(llm, close_backend=False)) as srv:
            body = frame.encode_contexts([[1, 2, 3]])
            t, got = _in_thread(request, srv.url, "POST", "/v1/logprobs", body, timeout=600)
            assert entered.wait(300), "the forward pass did not start"
            # the pass is held: these are answered only if the loop is not the one computing
            status, reply = request(srv.url, "GET", "/v1/health", timeout=60)
            assert status == 200 and json.loads(reply)["status"] == "ok"
            status, reply = request(srv.url, "GET", "/v1/stats", timeout=60)
            assert status == 200 and json.loads(reply)["inflight_requests"] == 1
            status, reply = post_json(srv.url, "/v1/tokenize", {"text": "hello"}, timeout=60)
            assert status == 200 and reply["ids"]
            release.set()
            t.join(600)
            assert "error" not in got, got
            status, reply = got["value"]
            assert status == 200, reply
        hook.remove()
        want = llm.next_token_logprobs_uncached([1, 2, 3])
        assert_backend_close(llm, torch.from_numpy(frame.decode_rows(reply).rows[0]), want, "a served row")
    finally:
        release.set()
        hook.remove()
        llm.close()


class _HeldTokenizer:
    """The mock's tokenizer, its ``encode`` held on an event (the probe of where it runs)."""

    def __init__(self, inner: Any, entered: threading.Event, release: threading.Event) -> None:
        self._inner, self._entered, self._release = inner, entered, release

    def encode(self, text: str, **kw: Any) -> list[int]:
        self._entered.set()
        self._release.wait(300)
        return self._inner.encode(text, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_tokenize_runs_off_the_loop() -> None:
    llm = genlm_core.load("mock")
    entered, release = threading.Event(), threading.Event()
    plain = llm.tokenizer
    llm.tokenizer = _HeldTokenizer(plain, entered, release)
    try:
        with InProcessServer(build_app(llm, close_backend=False)) as srv:
            t, got = _in_thread(post_json, srv.url, "/v1/tokenize", {"text": "the apple"}, timeout=600)
            assert entered.wait(300)
            status, _ = request(srv.url, "GET", "/v1/health", timeout=60)
            assert status == 200
            release.set()
            t.join(600)
            assert got["value"] == (200, {"ids": plain.encode("the apple")})
    finally:
        release.set()
        llm.close()


def test_a_departed_clients_queued_work_is_dropped_at_the_next_batch_boundary() -> None:
    """8 contexts in batches of 2, each pass 2 s: the client disconnects while the first
    pass runs; that pass finishes, the three others never start."""
    import socket

    from serve_http import host_port

    with ServerProcess("mock", opts={"work_s": 2.0, "batch_size": 2}) as srv:
        body = frame.encode_contexts([[5, i] for i in range(8)])
        host, port = host_port(srv.url)
        s = socket.create_connection((host, port), timeout=60)
        head = (
            f"POST /v1/logprobs HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {frame.MEDIA_TYPE}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        s.sendall(head.encode() + body)

        def stats() -> dict:
            return json.loads(request(srv.url, "GET", "/v1/stats", timeout=60)[1])

        deadline = time.monotonic() + 120
        while stats()["backend"]["batcher"]["batches"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        s.close()  # while the first pass runs
        deadline = time.monotonic() + 120
        while (st := stats())["inflight_requests"] or st["queue_depth"]:
            assert time.monotonic() < deadline, st
            time.sleep(0.1)
        time.sleep(3.0)  # a pass still to come would have started by now
        st = stats()
        assert st["backend"]["batcher"]["batches"] <= 2, st["backend"]["batcher"]
        assert st["errors"].get("client_disconnect") == 1, st["errors"]


def test_a_departed_clients_uncached_request_stops_at_the_next_context() -> None:
    """40 uncached contexts of 400 tokens, computed one by one: the client disconnects
    while the first is held; once it is released no other context is computed (the
    server used to run them all in one worker thread, which nothing can stop)."""
    import socket

    from serve_http import host_port

    llm = genlm_core.load("mock")
    plain = llm.next_token_logprobs_uncached
    computed: list[tuple[int, ...]] = []
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    def held(ctx: Any) -> Any:
        computed.append(tuple(ctx))
        entered.set()
        release.wait(300)
        try:
            return plain(ctx)
        finally:
            finished.set()

    llm.next_token_logprobs_uncached = held
    try:
        with InProcessServer(build_app(llm, close_backend=False)) as srv:
            contexts = [[(7 * i + j) % 200 + 1 for j in range(400)] for i in range(40)]
            body = frame.encode_contexts(contexts, uncached=True)
            host, port = host_port(srv.url)
            s = socket.create_connection((host, port), timeout=60)
            head = (
                f"POST /v1/logprobs HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: {frame.MEDIA_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            s.sendall(head.encode() + body)
            assert entered.wait(300), "the first context was not computed"
            s.close()  # while the first context is held

            def stats() -> dict:
                return json.loads(request(srv.url, "GET", "/v1/stats", timeout=60)[1])

            deadline = time.monotonic() + 120
            while stats()["errors"].get("client_disconnect") != 1:  # the server saw it go
                assert time.monotonic() < deadline, stats()
                time.sleep(0.05)
            release.set()
            assert finished.wait(300)
            time.sleep(1.0)  # the old thread went straight on to the next context
            assert len(computed) == 1, f"{len(computed)} of 40 contexts computed after the client left"
            assert stats()["inflight_requests"] == 0
    finally:
        release.set()
        llm.close()
