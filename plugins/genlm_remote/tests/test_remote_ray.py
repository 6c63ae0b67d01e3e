"""Two `genlm serve` replicas behind a Ray Serve deployment on a local Ray cluster
(loopback, 2 CPUs, no dashboard; started and stopped here): one client's requests are
spread over both replicas, every row is the mock's own (oracle: the mock in this
process), and each replica answers through a shared-memory segment of its own."""

from __future__ import annotations

import socket

import pytest
import torch

import genlm_core


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_ray(ray, attempts: int = 3) -> None:
    """A local cluster; on a loaded 2-core machine the raylet sometimes gives up waiting
    for its agent ("timed out during startup"): started again, at most ``attempts`` times
    (as genlm-vllm's Ray tests do)."""
    import os

    os.environ.setdefault("RAY_agent_register_timeout_ms", "180000")
    for attempt in range(attempts):
        try:
            ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception here
            ray.shutdown()
            if attempt == attempts - 1 or "timed out during startup" not in str(exc):
                raise


@pytest.fixture(scope="module")
def ray_serve_url():
    import ray
    from ray import serve

    from genlm_core.serve.ray_serve import deploy

    _start_ray(ray)
    try:
        url = deploy("mock", num_replicas=2, port=_free_port(), num_cpus=0.5)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


def test_one_clients_requests_are_spread_over_two_replicas(ray_serve_url) -> None:
    oracle = genlm_core.load("mock")
    llm = genlm_core.load("remote", url=ray_serve_url, cache_size=0)
    try:
        for i in range(24):
            ctxs = [[i + 1, 2], [i + 1, 3, 4]]
            assert torch.equal(
                llm.batch_next_token_logprobs_sync(ctxs), oracle.batch_next_token_logprobs_sync(ctxs)
            )
        replicas = llm.stats()["transport"]["replicas"]
        # Ray Serve routes each request on its own (power of two choices): with 24
        # requests both replicas answer some (all on one: probability ~2**-23)
        assert len(replicas) == 2 and sum(replicas.values()) == 24, replicas
        # replicas on this host answer through a segment of their own: the client got one
        # from the replica /v1/info reached, and one from the other after its first answer
        # (which came in a frame)
        transport = llm.stats()["transport"]
        assert transport["segments"] == 2 and transport["replies"]["frame"] <= 1, transport
    finally:
        llm.close()
        oracle.close()
