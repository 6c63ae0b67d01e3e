"""(c) Ray, on a local cluster this module starts and stops (loopback, 2 CPUs, no
dashboard), against the single-process TP=1 engine of the session (``tiny_backend``):

* vLLM's CPU platform refuses ``distributed_executor_backend="ray"`` (asserted with
  vLLM's own message);
* the nearest layout that runs: the backend inside a Ray actor
  (:class:`genlm_vllm.actor.VLLMActor`) with its engine's ranks over the ``mp``
  executor (TP=2): rows travel worker -> actor through ``/dev/shm`` and actor -> driver
  through Ray; a rank killed mid-batch fails the driver's call, and closing the actor
  and the cluster leaves no process, no live actor and no segment.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from conftest import TINY_BUDGET
from oracles import mixed_batch, random_ids
from processes import (
    LocalRay,
    alive,
    assert_gone,
    descendants,
    engine_segments,
    ray_get_while_progressing,
    shm_segments,
)

import genlm_core
from genlm_core.testing.tolerance import assert_tiny_close

#: seconds a driver call may take before it counts as a hang (a batch of the tiny model
#: takes well under a second). The engine start (20-60 s on 2 quiet cores, several
#: minutes at load ~6) is waited for as long as it uses CPU (ray_get_while_progressing).
CALL_S = 120


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


def test_backend_in_a_ray_actor_with_mp_workers(ray_cluster, tiny_path, tiny_backend) -> None:
    """A Ray actor holds the backend and its engine core; the engine's two TP ranks are
    processes of the actor (mp executor). Its rows reach the driver and equal TP=1;
    then a rank is killed mid-batch, and the actor and the cluster are closed."""
    import ray
    from genlm_vllm.actor import VLLMActor
    from genlm_vllm.lifecycle import EngineDiedError

    cluster, kids_before, segments_before = ray_cluster
    actor = (
        ray.remote(VLLMActor)
        .options(num_cpus=1, max_concurrency=2)  # threaded: in_flight() answers during a batch
        .remote(
            model=tiny_path,
            dtype="float32",
            enforce_eager=True,
            max_model_len=160,
            max_num_batched_tokens=TINY_BUDGET,
            batch_size=32,
            engine_opts={"block_size": 32, "tensor_parallel_size": 2, "distributed_executor_backend": "mp"},
        )
    )
    pids: set[int] = set()
    mine: set[str] = set()
    try:
        info = ray_get_while_progressing(actor.info.remote(), "the actor's engine start")
        workers = info["workers"]
        pids = {info["actor_pid"], *(w["pid"] for w in workers)}
        assert info["actor_pid"] != os.getpid() and not info["in_process"]
        assert info["tensor_parallel_size"] == 2 and info["distributed_executor_backend"] == "mp"
        assert [w["tp_rank"] for w in workers] == [0, 1]
        mine = engine_segments(workers)  # the ranks' queues, lock and communicator
        assert mine

        # rows: workers -> actor (/dev/shm) -> driver (Ray), equal to the TP=1 engine's
        # (TP=2 reorders float32 sums: ~4e-6 observed, the derived bound of genlm_core.testing.tolerance)
        batch = mixed_batch(tiny_backend)
        got = ray.get(actor.batch_next_token_logprobs.remote(batch), timeout=CALL_S)
        tiny_backend.clear_cache()
        want = tiny_backend.batch_next_token_logprobs_sync(batch)
        assert got.shape == want.shape and got.dtype == torch.float32
        for i in range(len(batch)):
            assert_tiny_close(got[i], want[i], str(i))
        counts = ray.get(actor.info.remote(), timeout=CALL_S)["transport_counts"]
        assert counts["shm"] > 0 and counts["bytes"] == 0
        greedy = ray.get(actor.batch_sample.remote([batch[1], batch[2]], 3, [], 0.0), timeout=CALL_S)
        assert [s[0] for s in greedy] == [int(torch.argmax(got[1])), int(torch.argmax(got[2]))]

        # a rank killed while a long batch runs (16 x 150 tokens: ~75 steps of 32)
        V, eos = len(tiny_backend.byte_vocab), tiny_backend.eos_token_ids
        long_batch = [random_ids(V, 150, 900 + k, eos) for k in range(16)]
        ref = actor.batch_next_token_logprobs.remote(long_batch)
        deadline = time.monotonic() + CALL_S
        while ray.get(actor.in_flight.remote(), timeout=CALL_S) == 0:
            assert time.monotonic() < deadline, "the batch never started"
            time.sleep(0.005)
        os.kill(workers[1]["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ray.exceptions.RayTaskError) as failed:
            ray.get(ref, timeout=CALL_S)  # a GetTimeoutError here would be the hang
        took = time.monotonic() - t0
        assert isinstance(failed.value.cause, RuntimeError), failed.value
        assert "died" in str(failed.value) or "failed" in str(failed.value)
        assert ray.get(actor.healthy.remote(), timeout=CALL_S) is False
        with pytest.raises(ray.exceptions.RayTaskError) as later:
            ray.get(actor.next_token_logprobs.remote([5, 6, 7]), timeout=CALL_S)
        assert isinstance(later.value.cause, EngineDiedError)
        print(f"driver call failed {took:.1f} s after the kill")

        ray.get(actor.close.remote(), timeout=CALL_S)  # the engine's workers stop, shm unlinked
    finally:
        ray.kill(actor)
    deadline = time.monotonic() + 30
    while LocalRay.alive_actors() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert LocalRay.alive_actors() == {}  # the GCS actor table
    cluster.stop()
    # the actor's workers are not our descendants once the actor is gone: checked by pid
    assert_gone(kids_before, segments_before, also=pids, engine=mine)
    assert not alive(pids)
