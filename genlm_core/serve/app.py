"""The Starlette application of ``genlm serve``: one backend, many clients.

Endpoints (all under ``/v1`` but ``/metrics``; every one but ``health`` needs the token
when one is set):

=====================  ======  ===========================================================
``/v1/health``         GET     ``{"status": "ok" | "closing", "healthy": bool}``
``/v1/info``           GET     backend, model, dtype, vocab size, EOS ids, context limit,
                               tokenizer identity, frame versions, limits, ``shm_socket``
``/v1/vocab``          GET     the byte vocabulary and its string forms (a VOCAB frame)
``/v1/logprobs``       POST    a CONTEXTS frame in, a ROWS frame out (rows in the frame, or
                               in a shared-memory segment the server gave the client)
``/v1/sample``         POST    JSON ``{"prompts", "max_tokens", "eos_token_ids",
                               "temperature", "seed", "batch"}`` -> ``{"samples"}``
``/v1/tokenize``       POST    JSON ``{"text", "add_special_tokens"}`` -> ``{"ids"}``
``/v1/detokenize``     POST    JSON ``{"ids", "skip_special_tokens"}`` -> ``{"text"}``
``/v1/stats``          GET     queue depth, rows per forward, phases, latencies, cache hit
                               rates, refusals per client (:mod:`genlm_core.serve.metrics`)
``/v1/clear_cache``    POST    drop the backend's output and KV caches (all clients')
``/metrics``           GET     the same in the Prometheus text format
=====================  ======  ===========================================================

Before any handler, :class:`~genlm_core.serve.security.RequestGuard` checks the Host,
the Origin, the media type of a POST and the token. The event loop only moves requests:
the backend computes in its batcher's thread (forced here whatever the backend prefers
in-process), and decoding, tokenizing and encoding run in worker threads, so health,
stats and every other client's request are answered while a forward pass runs. A
request counts as in flight once its body is read (:mod:`genlm_core.serve.bodies`: bytes
must keep coming, and the bodies read at once are capped over all clients); a client
that disconnects has its waiting work dropped at the next batch boundary (an ``uncached``
request's: at the next context).

Every logprobs request goes through the backend's own async path (its one AutoBatcher,
output cache and KV reuse), so rows asked by different clients at the same time share
forward passes. Errors are JSON ``{"error": message, "type": name}`` with a status: 400
bad input (malformed frame or JSON, a field of the wrong type or range, token out of
range, context too long, batch too large), 401 wrong token, 403 foreign Host or Origin,
408 body too slow (or stalled: dropped), 413 body or token budget too large, 415 wrong
media type, 503 too many concurrent requests (of all clients, or of one client) or
shutting down, 500 anything else. An error concerns its own request only.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from genlm_core.serve import frame
from genlm_core.serve.bodies import OpenBodies, read_body
from genlm_core.serve.departure import unless_departed
from genlm_core.serve.gather import Gatherer
from genlm_core.serve.inputs import (
    DetokenizeRequest,
    HTTPError,
    SampleRequest,
    TokenizeRequest,
    parse_json,
    token_budget,
)
from genlm_core.serve.limits import ServeLimits
from genlm_core.serve.metrics import ServerCounters, prometheus_text, server_stats
from genlm_core.serve.phases import RequestClock
from genlm_core.serve.security import RequestGuard, allowed_host_names
from genlm_core.serve.shm import SegmentServer

__all__ = ["PROTOCOL", "build_app"]

#: version of the HTTP surface above (the frame has its own)
PROTOCOL = 1
#: header naming the client process (genlm-remote sends a random id): see serve/gather.py
CLIENT_HEADER = "x-genlm-client"
JSON_TYPE = "application/json"
MEDIA_TYPES = {
    "/v1/logprobs": frame.MEDIA_TYPE,
    "/v1/sample": JSON_TYPE,
    "/v1/tokenize": JSON_TYPE,
    "/v1/detokenize": JSON_TYPE,
    "/v1/clear_cache": JSON_TYPE,
}


class ServerState:
    """What the handlers share: the backend, the limits, the counters, the segments."""

    def __init__(self, backend: Any, limits: ServeLimits, token: str | None) -> None:
        self.backend = backend
        self.limits = limits
        self.token = token
        self.closing = False
        self.counters = ServerCounters()
        self.gatherer = Gatherer(limits.gather_s)
        model_limit = getattr(backend, "max_context_length", None)
        mine = limits.max_context_length
        self.max_context_length = mine if model_limit is None else min(model_limit, mine or model_limit)
        self.vocab_size = len(backend.byte_vocab)
        self.segments = SegmentServer(self.vocab_size, limits.max_batch, limits.max_shm_segments, token)
        self.bodies = OpenBodies(limits.max_open_bodies, limits.max_open_body_bytes)
        self.replica = f"{socket.gethostname()}:{os.getpid()}"
        batcher = getattr(backend, "batcher", None)
        if batcher is not None:
            # the loop must stay free to answer while a forward pass runs, whatever the
            # backend prefers in a program of its own
            batcher.run_in_thread = True
        self.counters.forwards.install(backend)

    def stats(self) -> dict[str, Any]:
        return server_stats(self.backend, self.counters, self.gatherer, self.segments, self.bodies)


def _tokenizer_info(tok: Any) -> dict[str, Any]:
    def plain(v: Any) -> Any:
        return v if isinstance(v, (int, str, type(None))) else None

    try:
        length = len(tok)
    except TypeError:
        length = None
    specials = getattr(tok, "all_special_ids", None)
    return {
        "class": type(tok).__name__,
        "name_or_path": str(getattr(tok, "name_or_path", "") or ""),
        "eos_token_id": plain(getattr(tok, "eos_token_id", None)),
        "eos_token": plain(getattr(tok, "eos_token", None)),
        "bos_token_id": plain(getattr(tok, "bos_token_id", None)),
        "bos_token": plain(getattr(tok, "bos_token", None)),
        "pad_token_id": plain(getattr(tok, "pad_token_id", None)),
        "all_special_ids": [int(i) for i in specials] if isinstance(specials, (list, tuple)) else [],
        "len": length,
    }


def build_app(
    backend: Any,
    limits: ServeLimits | None = None,
    token: str | None = None,
    close_backend: bool = True,
    host: str = "127.0.0.1",
    allow_hosts: tuple[str, ...] = (),
    reply_bytes: bool = False,
) -> Starlette:
    """The application serving ``backend``. ``close_backend``: close it at shutdown.
    ``host``, ``allow_hosts``: the names clients may reach it by (the ``Host`` check).
    ``reply_bytes``: hand row replies to the server as ``bytes`` (one more copy) instead of
    a view of the buffer they were built in, for servers that pickle response messages
    (Ray Serve's replicas)."""
    state = ServerState(backend, limits or ServeLimits(), token)
    lim = state.limits
    counters = state.counters

    def endpoint(
        name: str, *, body: bool = False, counted: bool = True
    ) -> Callable[[Callable[..., Awaitable[Response]]], Callable[[Request], Awaitable[Response]]]:
        """Shutdown, per-client and concurrency checks, body reading and error mapping
        around a handler ``(request, body, clock)``. ``counted=False`` (health, info, stats,
        metrics): cheap reads that monitoring must get even at the concurrency limit."""

        def wrap(handler: Callable[..., Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
            async def run(request: Request) -> Response:
                clock = RequestClock()
                if not counted:
                    return await handler(request, b"", clock)
                data = await read_body(request, lim, state.bodies) if body else b""
                peer = request.client.host if request.client else "local"
                if counters.computing[peer] >= lim.max_requests_per_client:
                    counters.reject("client_limit", peer)
                    raise HTTPError(
                        503,
                        f"this client ({peer}) has {lim.max_requests_per_client} requests being computed "
                        "already; wait for their answers, or start the server with a higher "
                        "--max-requests-per-client",
                        "ServerBusy",
                    )
                if counters.inflight >= lim.max_concurrent_requests:
                    counters.reject("busy", peer)
                    raise HTTPError(
                        503,
                        f"the server is at its limit of {lim.max_concurrent_requests} concurrent requests; "
                        "retry later, or start it with a higher --max-concurrent-requests",
                        "ServerBusy",
                    )
                counters.inflight += 1
                counters.computing[peer] += 1
                try:
                    return await handler(request, data, clock)
                finally:
                    counters.inflight -= 1
                    counters.computing[peer] -= 1
                    if counters.computing[peer] <= 0:
                        del counters.computing[peer]

            async def guarded(request: Request) -> Response:
                counters.requests[name] += 1
                started = time.monotonic()
                try:
                    if state.closing:
                        raise HTTPError(503, "the server is shutting down", "ServerClosing")
                    return await run(request)
                except ClientDisconnect:
                    counters.errors["client_disconnect"] += 1
                    return Response(status_code=499)
                except HTTPError as exc:
                    counters.errors[str(exc.status)] += 1
                    return JSONResponse(
                        {"error": exc.message, "type": exc.kind}, status_code=exc.status, headers=exc.headers
                    )
                except ValueError as exc:  # bad input, malformed frame: this request only
                    counters.errors["400"] += 1
                    return JSONResponse({"error": str(exc), "type": type(exc).__name__}, status_code=400)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - one clear line to the client
                    counters.errors["500"] += 1
                    status = 503 if state.closing or not getattr(backend, "healthy", True) else 500
                    return JSONResponse(
                        {"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__},
                        status_code=status,
                    )
                finally:
                    counters.observe_latency(name, time.monotonic() - started)

            return guarded

        return wrap

    def check_contexts(contexts: list[Any], what: str = "context") -> list[tuple[int, ...]]:
        """Every context valid for the backend and within the server's limits (in a worker
        thread: a large request costs the loop nothing)."""
        token_budget(sum(len(c) for c in contexts), lim, f"a request with {len(contexts)} {what}s")
        # the server's own option, where it binds below the model's limit (the backend's
        # validate names the model's, or the engine's option, and the fix)
        limit = lim.max_context_length
        out = []
        for i, c in enumerate(contexts):
            if limit is not None and len(c) > limit and limit == state.max_context_length:
                raise ValueError(
                    f"{what} {i} has {len(c)} tokens, more than the server's limit of {limit} "
                    f"(genlm serve --max-context-length {limit}): shorten it (keep its last tokens), "
                    "or start the server with a larger --max-context-length"
                )
            try:
                out.append(backend.validate(c))
            except ValueError as exc:
                raise ValueError(f"{what} {i}: {exc}") from None
        return out

    @endpoint("health", counted=False)
    async def health(request: Request, body: bytes, clock: RequestClock) -> Response:
        return JSONResponse({"status": "ok", "healthy": bool(getattr(backend, "healthy", True))})

    @endpoint("info", counted=False)
    async def info(request: Request, body: bytes, clock: RequestClock) -> Response:
        return JSONResponse(
            {
                "protocol": PROTOCOL,
                "frame_versions": list(frame.SUPPORTED_VERSIONS),
                "backend": getattr(backend, "backend_name", type(backend).__name__),
                "model": str(getattr(getattr(backend, "config", None), "model", None) or ""),
                "dtype": str(backend.dtype),
                "vocab_size": state.vocab_size,
                "eos_token_ids": [int(e) for e in getattr(backend, "eos_token_ids", [])],
                "max_context_length": state.max_context_length,
                "tokenizer": _tokenizer_info(backend.tokenizer),
                "limits": lim.model_dump(),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "shm_socket": await state.segments.start(),
            }
        )

    vocab_frame: list[bytes] = []
    vocab_lock = asyncio.Lock()

    def encode_vocab() -> bytes:
        return frame.encode_vocab([bytes(t) for t in backend.byte_vocab], list(backend.str_vocab))

    @endpoint("vocab")
    async def vocab(request: Request, body: bytes, clock: RequestClock) -> Response:
        async with vocab_lock:
            if not vocab_frame:
                vocab_frame.append(await asyncio.to_thread(encode_vocab))
        return Response(vocab_frame[0], media_type=frame.MEDIA_TYPE)

    async def fetch_rows(contexts: list[tuple[int, ...]]) -> Any:
        """The rows of ``contexts`` through the backend's batcher (read only: cached rows
        are not copied; the encoder copies each row once, into the reply)."""
        shared = getattr(getattr(backend, "logprob_calls", None), "shared_row", None)
        if shared is None:
            return await backend.batch_next_token_logprobs(contexts)
        unique = list(dict.fromkeys(contexts))
        got = dict(zip(unique, await asyncio.gather(*(shared(c) for c in unique))))
        return [got[c] for c in contexts]

    def encode_reply(rows: Any, handles: list[str], clock: RequestClock) -> tuple[memoryview | bytes, str]:
        body, transport = encode_frame(rows, handles, clock)
        return (body.tobytes() if reply_bytes else body), transport

    def encode_frame(rows: Any, handles: list[str], clock: RequestClock) -> tuple[memoryview, str]:
        n, width = len(rows), state.vocab_size

        def stamps() -> dict[str, float]:
            clock.stamp("encoded")
            return clock.stamps()

        if handles and n:
            segment = state.segments.write(handles, rows)
            if segment is not None:
                return frame.encode_rows(
                    None, n, width, "shm", state.replica, segment=segment, t=stamps
                ), "shm"
        extra = {"shm_socket": state.segments.address} if handles and state.segments.address else {}
        return frame.encode_rows(rows, n, width, "frame", state.replica, t=stamps, **extra), "frame"

    @endpoint("logprobs", body=True)
    async def logprobs(request: Request, body: bytes, clock: RequestClock) -> Response:
        def decode() -> Any:
            req = frame.decode_contexts(body, max_batch=lim.max_batch)
            return req, check_contexts(req.contexts)

        req, contexts = await asyncio.to_thread(decode)
        clock.stamp("decoded")
        client = request.headers.get(CLIENT_HEADER)
        if req.uncached:
            clock.stamp("released")
            rows = await unless_departed(request, _uncached_rows(backend, contexts))
        else:
            await state.gatherer.arrive(client)
            clock.stamp("released")
            try:
                rows = await unless_departed(request, fetch_rows(contexts))
            finally:
                state.gatherer.leave(client)
        clock.stamp("rows")
        clock.attribute(counters.forwards)
        reply, transport = await asyncio.to_thread(encode_reply, rows, req.shm, clock)
        counters.rows[transport] += len(contexts)
        counters.bytes_out["logprobs"] += len(reply)
        for phase, seconds in clock.phases().items():
            counters.phases[phase].observe(seconds)
        return Response(reply, media_type=frame.MEDIA_TYPE)

    @endpoint("sample", body=True)
    async def sample(request: Request, body: bytes, clock: RequestClock) -> Response:
        data = await asyncio.to_thread(parse_json, body)
        req: SampleRequest = SampleRequest.parse(data, "sample")
        if len(req.prompts) > lim.max_batch:
            raise ValueError(
                f"field 'prompts': {len(req.prompts)} prompts in one request, above the server's "
                f"limit of {lim.max_batch}"
            )
        if req.max_tokens > lim.max_sample_tokens:
            raise ValueError(
                f"field 'max_tokens': {req.max_tokens} is above the server's limit of {lim.max_sample_tokens}"
            )
        token_budget(
            sum(len(p) for p in req.prompts) + len(req.prompts) * req.max_tokens,
            lim,
            f"a sampling request ({len(req.prompts)} prompts, max_tokens={req.max_tokens})",
        )
        prompts = await asyncio.to_thread(check_contexts, req.prompts, "prompt")
        bad = [e for e in req.eos_token_ids or [] if not 0 <= e < state.vocab_size]
        if bad:
            raise ValueError(
                f"field 'eos_token_ids': ids {bad[:5]} are outside the vocabulary [0, {state.vocab_size})"
            )
        args = (req.max_tokens, req.eos_token_ids, req.temperature, req.seed)
        if req.batch:
            samples = await unless_departed(request, backend.batch_sample(prompts, *args))
        else:
            if len(prompts) != 1:
                raise ValueError("field 'prompts': a non-batch sampling request takes exactly one prompt")
            samples = [await unless_departed(request, backend.sample(prompts[0], *args))]
        return JSONResponse({"samples": [[int(t) for t in s] for s in samples]})

    @endpoint("tokenize", body=True)
    async def tokenize(request: Request, body: bytes, clock: RequestClock) -> Response:
        req: TokenizeRequest = TokenizeRequest.parse(await asyncio.to_thread(parse_json, body), "tokenize")
        size = len(req.text.encode("utf-8"))  # characters only: TokenizeRequest checked
        if size > lim.max_text_bytes:
            raise HTTPError(
                413,
                f"field 'text': {size} bytes, above the server's limit of {lim.max_text_bytes} "
                "(--max-text-bytes); tokenize it in parts",
                "TextTooLong",
            )
        ids = await asyncio.to_thread(
            backend.tokenizer.encode, req.text, add_special_tokens=req.add_special_tokens
        )
        return JSONResponse({"ids": [int(i) for i in ids]})

    @endpoint("detokenize", body=True)
    async def detokenize(request: Request, body: bytes, clock: RequestClock) -> Response:
        req: DetokenizeRequest = DetokenizeRequest.parse(
            await asyncio.to_thread(parse_json, body), "detokenize"
        )
        token_budget(len(req.ids), lim, "a detokenize request")
        bad = [i for i in req.ids if not 0 <= i < state.vocab_size]
        if bad:
            raise ValueError(
                f"field 'ids': token ids {bad[:5]} are outside the vocabulary [0, {state.vocab_size})"
            )
        text = await asyncio.to_thread(
            backend.tokenizer.decode, req.ids, skip_special_tokens=req.skip_special_tokens
        )
        return JSONResponse({"text": text})

    @endpoint("clear_cache", body=True)
    async def clear_cache(request: Request, body: bytes, clock: RequestClock) -> Response:
        """Drop the backend's output cache and KV caches (every client's: benchmarks use it
        between layouts; results never change, only what is recomputed)."""
        await asyncio.to_thread(_clear, backend)
        return JSONResponse({"cleared": True})

    @endpoint("stats", counted=False)
    async def stats(request: Request, body: bytes, clock: RequestClock) -> Response:
        return JSONResponse(state.stats())

    @endpoint("metrics", counted=False)
    async def metrics(request: Request, body: bytes, clock: RequestClock) -> Response:
        text, media_type = prometheus_text(state.stats())
        return Response(text, media_type=media_type)

    @asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        await state.segments.start()
        yield
        # uvicorn has stopped accepting and waited (up to its graceful timeout) for the
        # requests in flight; anything still queued in the batcher is failed by close()
        state.closing = True
        state.segments.close()
        if close_backend:
            backend.close()

    def refused(status: int, kind: str, client: str) -> None:
        counters.errors[str(status)] += 1
        counters.reject(kind, client)

    routes = [
        Route("/v1/health", health),
        Route("/v1/info", info),
        Route("/v1/vocab", vocab),
        Route("/v1/logprobs", logprobs, methods=["POST"]),
        Route("/v1/sample", sample, methods=["POST"]),
        Route("/v1/tokenize", tokenize, methods=["POST"]),
        Route("/v1/detokenize", detokenize, methods=["POST"]),
        Route("/v1/stats", stats),
        Route("/v1/clear_cache", clear_cache, methods=["POST"]),
        Route("/metrics", metrics),
    ]
    guard = Middleware(
        RequestGuard,
        hosts=allowed_host_names(host, allow_hosts),
        any_ip=host in ("0.0.0.0", "::", ""),
        token=token,
        media_types=MEDIA_TYPES,
        on_refused=refused,
    )
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[guard])
    app.state.genlm = state
    return app


def _clear(backend: Any) -> None:
    lock = getattr(backend, "engine_lock", None)
    if lock is None:
        backend.clear_cache()
        return
    with lock:  # not while a batch runs in the engine
        backend.clear_cache()


async def _uncached_rows(backend: Any, contexts: list[tuple[int, ...]]) -> Any:
    """Each context's uncached pass in a worker thread of its own, one after the other:
    cancelled (its client gone), the request stops at the next context boundary (a thread
    cannot be interrupted: the pass running finishes, no other starts)."""
    import torch

    if not contexts:
        return torch.empty((0, len(backend.byte_vocab)), dtype=torch.float32)
    return [await asyncio.to_thread(backend.next_token_logprobs_uncached, c) for c in contexts]
