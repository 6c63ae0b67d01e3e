"""(c) Ray, on a local cluster this module starts and stops (loopback, 2 CPUs, no
dashboard): vLLM's CPU platform refuses ``distributed_executor_backend="ray"``
(asserted with vLLM's own message)."""

from __future__ import annotations

import pytest
from processes import LocalRay, assert_gone, descendants, shm_segments

import genlm_core


@pytest.fixture(scope="module")
def ray_cluster():
    kids, segments = descendants(), shm_segments()
    cluster = LocalRay(num_cpus=2).start()
    yield cluster, kids, segments
    cluster.stop()
    assert_gone(kids, segments)


def test_ray_executor_is_refused_on_cpu(ray_cluster, tiny_path) -> None:
    """vLLM's CPU platform has no Ray device key and refuses the executor with its own
    error; no worker actor is left behind."""
    import ray

    assert ray.cluster_resources().get("CPU") == 2
    with pytest.raises(ValueError, match="current platform cpu does not support ray"):
        genlm_core.load(
            "vllm",
            model=tiny_path,
            dtype="float32",
            enforce_eager=True,
            max_model_len=160,
            engine_opts={"distributed_executor_backend": "ray"},
        )
    assert LocalRay.alive_actors() == {}
