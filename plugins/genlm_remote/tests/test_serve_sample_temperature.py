"""``/v1/sample`` takes ``temperature`` as ``llm.sample`` does in process (the same backend
call, genlm_core.engine.sampling.sampling_temperature): one that overflows a float32
division (5e-324, 1e-45) draws greedily on the server, through the remote client and in
process alike. Oracle: the in-process greedy draw (``temperature=0``) of the served
backend."""

from __future__ import annotations

import pytest
from serve_http import post_json

import genlm_core
from genlm_core.serve.app import build_app
from genlm_core.serve.testing import InProcessServer

PROMPTS = [[1, 2, 3], [4, 5]]


@pytest.fixture(scope="module")
def served():
    llm = genlm_core.load("mock", max_context_length=64)
    with InProcessServer(build_app(llm, close_backend=False)) as srv:
        yield llm, srv
    llm.close()


@pytest.mark.parametrize("temperature", [5e-324, 1e-45])
def test_a_temperature_that_overflows_float32_is_greedy_on_the_server_as_in_process(
    served, temperature
) -> None:
    llm, srv = served
    greedy = [llm.sample_sync(p, max_tokens=5, temperature=0.0, eos_token_ids=[]) for p in PROMPTS]
    assert [
        llm.sample_sync(p, max_tokens=5, temperature=temperature, eos_token_ids=[]) for p in PROMPTS
    ] == greedy
    body = {"max_tokens": 5, "temperature": temperature, "eos_token_ids": [], "seed": 3}
    status, reply = post_json(srv.url, "/v1/sample", {**body, "prompts": PROMPTS, "batch": True})
    assert status == 200, reply
    assert reply["samples"] == greedy
    status, reply = post_json(srv.url, "/v1/sample", {**body, "prompts": PROMPTS[:1]})
    assert status == 200 and reply["samples"] == greedy[:1], reply
    remote = genlm_core.load("remote", url=srv.url)
    try:
        assert (
            remote.sample_sync(PROMPTS[0], max_tokens=5, temperature=temperature, eos_token_ids=[])
            == greedy[0]
        )
    finally:
        remote.close()
