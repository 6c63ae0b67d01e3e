"""Run the application under uvicorn: bind, announce readiness, shut down gracefully.

``serve()`` binds the socket itself (so ``port=0`` picks a free port and the ready line
names it), refuses a non-loopback bind without a token, prints one line
``genlm serve: ready on http://HOST:PORT`` on stdout once uvicorn accepts connections,
and returns after SIGINT/SIGTERM: uvicorn stops accepting, lets the requests in flight
finish for up to ``limits.graceful_shutdown_s`` (then cancels them: their clients get a
closed connection, never a hang), and the backend is closed (queued requests fail).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from genlm_core.serve.limits import ServeLimits, check_bind

__all__ = ["bind_socket", "serve", "server_class", "served_backend_options"]

READY_PREFIX = "genlm serve: ready on "


def served_backend_options(backend: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options a server loads ``backend`` with: ``options``, and where they leave it
    unset and the backend's config has it, ``cache_to_cpu=True``.

    A server's output cache holds rows of every client's contexts (a client's
    ``clear_cache()`` drops only its own cache) up to ``cache_bytes`` (1 GiB by default):
    on a GPU that memory would sit beside the model's KV buffers, for rows that leave over
    the wire from host memory anyway. In host memory it costs one transfer of a pass's
    rows (:func:`genlm_core.engine.memory.cpu_copies`); on a CPU engine nothing
    changes. ``--opt cache_to_cpu=false`` keeps it on the device."""
    out = dict(options)
    if "cache_to_cpu" not in out:
        from genlm_core.api import resolve

        config = resolve(backend).load_config_class()
        if config is not None and "cache_to_cpu" in getattr(config, "model_fields", {}):
            out["cache_to_cpu"] = True
    return out


def server_class() -> Any:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn's server without its own signal capture: uvicorn re-raises a captured
        SIGINT/SIGTERM after its graceful shutdown (a KeyboardInterrupt, or death by
        SIGTERM before our cleanup); ``serve()`` routes both signals to
        ``handle_exit`` instead, so a shutdown is an ordinary return."""

        @contextlib.contextmanager
        def capture_signals(self):  # type: ignore[no-untyped-def]
            yield

    return QuietServer


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it (Linux): a response is written as headers, then body,
    # and with Nagle's algorithm the body of every keep-alive reply after the first waited
    # for the client's delayed ACK (~40 ms a request, measured)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot bind {host}:{port}: {exc.strerror or exc} (pick another --port)") from None
    sock.set_inheritable(True)
    return sock


def serve(
    backend: Any,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    limits: ServeLimits | None = None,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "warning",
    allow_hosts: tuple[str, ...] = (),
) -> None:
    """Serve ``backend`` until interrupted; the backend is closed on the way out.
    ``allow_hosts``: further names clients may reach it by (the ``Host`` check,
    :mod:`genlm_core.serve.security`)."""
    import uvicorn

    from genlm_core.serve.app import build_app

    check_bind(host, token)
    limits = limits or ServeLimits()
    sock = bind_socket(host, port)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}"
    app = build_app(backend, limits, token, host=host, allow_hosts=allow_hosts)
    config = uvicorn.Config(
        app,
        loop="asyncio",  # the batcher's tick policy reads CPython's ready queue
        lifespan="on",
        log_level=log_level,
        timeout_graceful_shutdown=limits.graceful_shutdown_s,
        timeout_keep_alive=30,
    )
    server = server_class()(config)

    def announce(u: str) -> None:
        print(READY_PREFIX + u, flush=True)

    ready = on_ready or announce

    async def main() -> None:
        loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, server.handle_exit, sig, None)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            ready(url)
        await task

    try:
        asyncio.run(main())
    finally:
        sock.close()
        backend.close()  # idempotent: also when startup failed before the lifespan ran
        sys.stdout.flush()
