"""Several ``genlm serve`` replicas behind one Ray Serve deployment (docs/scale-out.md).

Each replica is a Ray actor that loads the backend once and serves the same Starlette
application as ``genlm serve`` (:func:`genlm_core.serve.app.build_app`, through Ray
Serve's ASGI ingress). Ray Serve's HTTP proxy routes every request on its own, so one
client's requests spread over the replicas (each ROWS reply names the replica that
computed it: ``llm.stats()["transport"]["replicas"]`` of a remote backend). The client is the
ordinary remote backend pointed at the proxy: ``load("remote", url=proxy_url)``.

Replicas on the client's host answer through a shared-memory segment of their own
(:mod:`genlm_core.serve.shm`: a client gets one from each replica that answers it);
replicas on other nodes answer with the frame.
Requires ``ray[serve]``; imports nothing of Ray until called.
"""

from __future__ import annotations

from typing import Any

from genlm_core.serve.limits import ServeLimits, check_bind

__all__ = ["deploy", "replica_class"]


def replica_class() -> Any:
    """The Ray Serve deployment class (built lazily: importing Ray is slow)."""
    from ray import serve

    @serve.ingress()
    class GenlmReplica:
        def __init__(
            self,
            backend: str,
            load_options: dict[str, Any],
            limits: dict,
            token: str | None,
            host: str = "127.0.0.1",
        ) -> None:
            import genlm_core
            from genlm_core.serve.app import build_app

            self.llm = genlm_core.load(backend, **load_options)
            # ("app" is Ray's); the Host names: those of the proxy clients connect to; replies
            # as bytes: a replica pickles every response message on its way to the proxy
            self.genlm_app = build_app(self.llm, ServeLimits(**limits), token, host=host, reply_bytes=True)

        def __serve_build_asgi_app__(self) -> Any:
            return self.genlm_app

        def __del__(self) -> None:
            llm = getattr(self, "llm", None)
            if llm is not None:
                llm.close()

    return GenlmReplica


def deploy(
    backend: str,
    *,
    num_replicas: int = 2,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    limits: ServeLimits | None = None,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    name: str = "genlm",
    **load_options: Any,
) -> str:
    """Start (or update) ``num_replicas`` replicas of ``backend`` on the Ray cluster this
    process is connected to (``ray.init`` first), behind Ray Serve's proxy on
    ``host:port``. Returns the URL clients load: ``load("remote", url=...)``.
    Stop with ``ray.serve.shutdown()``."""
    from ray import serve

    check_bind(host, token)
    limits = limits or ServeLimits()
    serve.start(http_options={"host": host, "port": port})
    deployment = serve.deployment(
        replica_class(),
        name=f"{name}-{backend}",
        num_replicas=num_replicas,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
        max_ongoing_requests=limits.max_concurrent_requests,
    )
    serve.run(
        deployment.bind(backend, load_options, limits.model_dump(), token, host), name=name, route_prefix="/"
    )
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def run_replicas(backend: str, num_replicas: int, host: str, port: int, token: str | None, limits: ServeLimits,
                 **load_options: Any) -> None:  # fmt: skip
    """``genlm serve BACKEND --replicas N``: join the Ray cluster named by ``RAY_ADDRESS``
    (or start a local one), deploy, print the ready line, and on SIGINT/SIGTERM shut the
    deployment (and a cluster it started) down."""
    import os
    import signal
    import threading

    import ray
    from ray import serve

    from genlm_core.serve.run import READY_PREFIX

    check_bind(host, token)
    started = not os.environ.get("RAY_ADDRESS")
    ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        url = deploy(backend, num_replicas=num_replicas, host=host, port=port, token=token, limits=limits,
                     **load_options)  # fmt: skip
        print(READY_PREFIX + url, flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        if started:
            ray.shutdown()
