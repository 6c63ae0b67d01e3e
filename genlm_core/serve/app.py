"""The Starlette application of ``genlm serve``: one backend, many clients.

Endpoints (all under ``/v1``; every one but ``health`` needs the token when one is set):

=====================  ======  ===========================================================
``/v1/health``         GET     ``{"status": "ok" | "closing", "healthy": bool}``
``/v1/info``           GET     backend, model, dtype, vocab size, EOS ids, context limit,
                               tokenizer identity, frame versions, limits (JSON)
``/v1/vocab``          GET     the byte vocabulary and its string forms (a VOCAB frame)
``/v1/logprobs``       POST    a CONTEXTS frame in, a ROWS frame out (rows in the frame, or
                               in the client's ``/dev/shm`` buffer when it named one the
                               server can open)
``/v1/sample``         POST    JSON ``{"prompts", "max_tokens", "eos_token_ids",
                               "temperature", "seed", "batch"}`` -> ``{"samples"}``
``/v1/tokenize``       POST    JSON ``{"text", "add_special_tokens"}`` -> ``{"ids"}``
``/v1/detokenize``     POST    JSON ``{"ids", "skip_special_tokens"}`` -> ``{"text"}``
``/v1/stats``          GET     queue depth, batch sizes, cache hit rates, rows per transport
``/v1/clear_cache``    POST    drop the backend's output and KV caches (all clients')
=====================  ======  ===========================================================

Every logprobs request goes through the backend's own async path
(``batch_next_token_logprobs``: its one AutoBatcher, output cache and KV reuse), so
rows asked by different clients at the same time share forward passes. Errors are JSON
``{"error": message, "type": name}`` with a status: 400 bad input (``ValueError``:
malformed frame, token out of range, context too long, batch too large), 401 wrong
token, 413 body too large, 503 too many concurrent requests or shutting down, 500
anything else. An error concerns its own request only.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from genlm_core.engine.row_transport import write_block
from genlm_core.serve import frame
from genlm_core.serve.gather import Gatherer
from genlm_core.serve.limits import ServeLimits, token_matches

__all__ = ["PROTOCOL", "build_app"]

#: version of the HTTP surface above (the frame has its own)
PROTOCOL = 1
#: header naming the client process (genlm-remote sends a random id): see serve/gather.py
CLIENT_HEADER = "x-genlm-client"


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class ServerState:
    """What the handlers share: the backend, the limits and the counters for /v1/stats."""

    def __init__(self, backend: Any, limits: ServeLimits, token: str | None) -> None:
        self.backend = backend
        self.limits = limits
        self.token = token
        self.closing = False
        self.inflight = 0
        self.started = time.time()
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.rows: Counter[str] = Counter()
        self.bytes_out: Counter[str] = Counter()
        self.rejected_busy = 0
        self.gatherer = Gatherer(limits.gather_s)
        model_limit = getattr(backend, "max_context_length", None)
        mine = limits.max_context_length
        self.max_context_length = mine if model_limit is None else min(model_limit, mine or model_limit)


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
    backend: Any, limits: ServeLimits | None = None, token: str | None = None, close_backend: bool = True
) -> Starlette:
    """The application serving ``backend``. ``close_backend``: close it at shutdown."""
    state = ServerState(backend, limits or ServeLimits(), token)
    lim = state.limits

    def guarded(
        name: str, need_token: bool = True, counted: bool = True
    ) -> Callable[[Callable[..., Awaitable[Response]]], Any]:
        """Token, shutdown and concurrency checks and error mapping around a handler.
        ``counted=False`` (health, info, stats): cheap reads that monitoring must get
        even when the server is at its concurrency limit."""

        def wrap(
            handler: Callable[[Request], Awaitable[Response]],
        ) -> Callable[[Request], Awaitable[Response]]:
            async def endpoint(request: Request) -> Response:
                state.requests[name] += 1
                try:
                    if need_token and not token_matches(state.token, request.headers.get("authorization")):
                        raise _HTTPError(401, "missing or wrong token (send 'Authorization: Bearer <token>')")
                    if state.closing:
                        raise _HTTPError(503, "the server is shutting down", "ServerClosing")
                    if not counted:
                        return await handler(request)
                    if state.inflight >= lim.max_concurrent_requests:
                        state.rejected_busy += 1
                        raise _HTTPError(
                            503,
                            f"the server is at its limit of {lim.max_concurrent_requests} concurrent requests; "
                            "retry later, or start it with a higher --max-concurrent-requests",
                            "ServerBusy",
                        )
                    state.inflight += 1
                    try:
                        return await handler(request)
                    finally:
                        state.inflight -= 1
                except ClientDisconnect:
                    state.errors["client_disconnect"] += 1
                    return Response(status_code=499)
                except _HTTPError as exc:
                    state.errors[str(exc.status)] += 1
                    return JSONResponse({"error": exc.message, "type": exc.kind}, status_code=exc.status)
                except ValueError as exc:  # bad input, malformed frame: this request only
                    state.errors["400"] += 1
                    return JSONResponse({"error": str(exc), "type": type(exc).__name__}, status_code=400)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - one clear line to the client
                    state.errors["500"] += 1
                    status = 503 if state.closing or not getattr(backend, "healthy", True) else 500
                    return JSONResponse(
                        {"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__},
                        status_code=status,
                    )

            return endpoint

        return wrap

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > lim.max_body_bytes:
            raise _HTTPError(
                413, f"request body of {declared} bytes is above the server's limit of {lim.max_body_bytes}"
            )
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > lim.max_body_bytes:
                raise _HTTPError(
                    413, f"request body is above the server's limit of {lim.max_body_bytes} bytes"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    async def read_json(request: Request) -> dict[str, Any]:
        try:
            data = json.loads(await read_body(request))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"request body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("request body must be a JSON object")
        return data

    def check_lengths(contexts: Any) -> None:
        limit = state.max_context_length
        if limit is None:
            return
        for i, c in enumerate(contexts):
            if isinstance(c, (list, tuple)) and len(c) > limit:
                raise ValueError(
                    f"context {i} has {len(c)} tokens, more than the server's limit of {limit}; shorten it"
                )

    @guarded("health", need_token=False, counted=False)
    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "healthy": bool(getattr(backend, "healthy", True))})

    @guarded("info", counted=False)
    async def info(request: Request) -> Response:
        return JSONResponse(
            {
                "protocol": PROTOCOL,
                "frame_versions": list(frame.SUPPORTED_VERSIONS),
                "backend": getattr(backend, "backend_name", type(backend).__name__),
                "model": str(getattr(getattr(backend, "config", None), "model", None) or ""),
                "dtype": str(backend.dtype),
                "vocab_size": len(backend.byte_vocab),
                "eos_token_ids": [int(e) for e in getattr(backend, "eos_token_ids", [])],
                "max_context_length": state.max_context_length,
                "tokenizer": _tokenizer_info(backend.tokenizer),
                "limits": lim.model_dump(),
                "host": socket.gethostname(),
                "pid": os.getpid(),
            }
        )

    vocab_frame: list[bytes] = []
    replica = f"{socket.gethostname()}:{os.getpid()}"

    @guarded("vocab")
    async def vocab(request: Request) -> Response:
        if not vocab_frame:
            vocab_frame.append(
                frame.encode_vocab([bytes(t) for t in backend.byte_vocab], list(backend.str_vocab))
            )
        return Response(vocab_frame[0], media_type=frame.MEDIA_TYPE)

    @guarded("logprobs")
    async def logprobs(request: Request) -> Response:
        req = frame.decode_contexts(await read_body(request), max_batch=lim.max_batch)
        check_lengths(req.contexts)
        client = request.headers.get(CLIENT_HEADER)
        if req.uncached:
            rows = await asyncio.to_thread(_uncached_rows, backend, req.contexts)
        else:
            await state.gatherer.arrive(client)
            try:
                rows = await backend.batch_next_token_logprobs(req.contexts)
            finally:
                state.gatherer.leave(client)
        arr = np.ascontiguousarray(rows.detach().to("cpu").numpy(), dtype=np.float32)
        n, width = arr.shape
        if req.shm is not None and n and write_block(arr, req.shm):
            body = frame.encode_rows(None, n, width, "shm", replica)
            state.rows["shm"] += n
        else:
            body = frame.encode_rows(arr, n, width, "frame", replica)
            state.rows["frame"] += n
        state.bytes_out["logprobs"] += len(body)
        return Response(body, media_type=frame.MEDIA_TYPE)

    @guarded("sample")
    async def sample(request: Request) -> Response:
        data = await read_json(request)
        prompts = data.get("prompts")
        if not isinstance(prompts, list):
            raise ValueError("'prompts' must be a list of token-id lists")
        if len(prompts) > lim.max_batch:
            raise ValueError(
                f"{len(prompts)} prompts in one request, above the server's limit of {lim.max_batch}"
            )
        check_lengths(prompts)
        max_tokens = data.get("max_tokens")
        if isinstance(max_tokens, int) and max_tokens > lim.max_sample_tokens:
            raise ValueError(
                f"max_tokens={max_tokens} is above the server's limit of {lim.max_sample_tokens}"
            )
        args = (max_tokens, data.get("eos_token_ids"), data.get("temperature", 1.0), data.get("seed"))
        if not isinstance(args[2], (int, float)) or isinstance(args[2], bool):
            raise ValueError(f"temperature must be a number, got {args[2]!r}")
        if args[3] is not None and (not isinstance(args[3], int) or isinstance(args[3], bool)):
            raise ValueError(f"seed must be an int or null, got {args[3]!r}")
        if data.get("batch", True):
            samples = await backend.batch_sample(prompts, *args)
        else:
            if len(prompts) != 1:
                raise ValueError("a non-batch sampling request takes exactly one prompt")
            samples = [await backend.sample(prompts[0], *args)]
        return JSONResponse({"samples": [[int(t) for t in s] for s in samples]})

    @guarded("tokenize")
    async def tokenize(request: Request) -> Response:
        data = await read_json(request)
        text = data.get("text")
        if not isinstance(text, str):
            raise ValueError("'text' must be a string")
        if len(text.encode("utf-8", errors="surrogatepass")) > lim.max_body_bytes:
            raise _HTTPError(413, "text is above the server's body limit")
        ids = backend.tokenizer.encode(text, add_special_tokens=bool(data.get("add_special_tokens", True)))
        return JSONResponse({"ids": [int(i) for i in ids]})

    @guarded("detokenize")
    async def detokenize(request: Request) -> Response:
        data = await read_json(request)
        ids = data.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError("'ids' must be a list of ints")
        bad = [i for i in ids if not 0 <= i < len(backend.byte_vocab)]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {len(backend.byte_vocab)})")
        text = backend.tokenizer.decode(ids, skip_special_tokens=bool(data.get("skip_special_tokens", False)))
        return JSONResponse({"text": text})

    @guarded("clear_cache")
    async def clear_cache(request: Request) -> Response:
        """Drop the backend's output cache and KV caches (every client's: benchmarks use it
        between layouts; results never change, only what is recomputed)."""
        await asyncio.to_thread(_clear, backend)
        return JSONResponse({"cleared": True})

    @guarded("stats", counted=False)
    async def stats(request: Request) -> Response:
        return JSONResponse(server_stats(state))

    @asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        yield
        # uvicorn has stopped accepting and waited (up to its graceful timeout) for the
        # requests in flight; anything still queued in the batcher is failed by close()
        state.closing = True
        if close_backend:
            backend.close()

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
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.genlm = state
    return app


def _clear(backend: Any) -> None:
    lock = getattr(backend, "engine_lock", None)
    if lock is None:
        backend.clear_cache()
        return
    with lock:  # not while a batch runs in the engine
        backend.clear_cache()


def _uncached_rows(backend: Any, contexts: list[tuple[int, ...]]) -> Any:
    import torch

    if not contexts:
        return torch.empty((0, len(backend.byte_vocab)), dtype=torch.float32)
    return torch.stack([backend.next_token_logprobs_uncached(c) for c in contexts])


def server_stats(state: ServerState) -> dict[str, Any]:
    """Queue depth, batch sizes, cache hit rates and transport counts of a server."""
    backend = state.backend
    out: dict[str, Any] = {
        "uptime_s": time.time() - state.started,
        "inflight_requests": state.inflight,
        "rejected_busy": state.rejected_busy,
        "requests": dict(state.requests),
        "errors": dict(state.errors),
        "rows": dict(state.rows),
        "bytes_out": dict(state.bytes_out),
        "gather": state.gatherer.stats(),
    }
    batcher = getattr(backend, "batcher", None)
    if batcher is not None:
        out["queue_depth"] = batcher.pending_count()
        sizes = list(batcher.stats.batch_sizes[-1000:])
        out["batch_sizes"] = {
            "recent": len(sizes),
            "mean": float(np.mean(sizes)) if sizes else 0.0,
            "max": max(sizes, default=0),
            "histogram": {str(k): v for k, v in sorted(Counter(sizes).items())},
        }
    backend_stats = backend.stats() if hasattr(backend, "stats") else {}
    out["backend"] = backend_stats
    caches = {}
    for name, value in backend_stats.items():
        if isinstance(value, dict) and "hits" in value and "misses" in value:
            looked = value["hits"] + value["misses"]
            caches[name] = value["hits"] / looked if looked else 0.0
    out["cache_hit_rate"] = caches
    return out
