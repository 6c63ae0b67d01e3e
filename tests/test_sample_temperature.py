"""``temperature`` of ``sample``: one meaning for every engine (genlm_core.engine.sampling).

Oracles: greedy draws (``temperature=0``: the argmax of the backend's own rows), the
request an engine sampler written here receives, and rows with masked (-inf) tokens,
which no draw may pick. A temperature whose division overflows float32 (5e-324, 1e-45)
draws greedily; one beyond float32's range draws as float32's largest value; a
temperature that is no finite number >= 0 is a ValueError naming the field (a TypeError
for no number), as for the byte beam's ``sample``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import genlm_core
from genlm_core.config import BackendConfig
from genlm_core.engine import BaseLogprobBackend, Engine, SampleRequest, Token
from genlm_core.engine.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE

V = 8
TINY = [
    5e-324,
    1e-45,
    1e-40,
    MIN_TEMPERATURE / 2,
]  # below the bound (a float32 division by the first three overflows)


class Tok:
    eos_token_id = 7


@pytest.fixture
def llm():
    backend = genlm_core.load("mock")
    yield backend
    backend.close()


@pytest.mark.parametrize("temperature", TINY)
async def test_a_temperature_that_overflows_float32_draws_greedily(llm, temperature: float) -> None:
    prompt = [1, 2, 3]
    greedy = llm.sample_sync(prompt, max_tokens=6, temperature=0.0, eos_token_ids=[])
    assert llm.sample_sync(prompt, max_tokens=6, temperature=temperature, seed=1, eos_token_ids=[]) == greedy
    assert await llm.sample(prompt, max_tokens=6, temperature=temperature, eos_token_ids=[]) == greedy
    both = await llm.batch_sample([prompt, prompt], max_tokens=6, temperature=temperature, eos_token_ids=[])
    assert both == [greedy, greedy]


@pytest.mark.parametrize("temperature", [float("inf"), float("nan"), -1e-30])
def test_a_temperature_that_is_no_finite_number_is_refused_naming_the_field(llm, temperature: Any) -> None:
    with pytest.raises(ValueError, match=r"temperature must be a finite number >= 0 \(0: greedy\)"):
        llm.sample_sync([1], max_tokens=2, temperature=temperature)
    for bad in ("hot", None, True):
        with pytest.raises(TypeError, match="temperature must be a real number >= 0"):
            llm.sample_sync([1], max_tokens=2, temperature=bad)


class MaskedRows(Engine):
    """Rows where only tokens 2 and 3 have a finite score."""

    def __init__(self) -> None:
        self.tokenizer = Tok()
        self.byte_vocab = [Token(i, bytes([97 + i])) for i in range(V)]

    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        row = torch.full((V,), float("-inf"))
        row[2], row[3] = 0.0, -1.0
        return row.expand(len(contexts), V)


def test_a_huge_temperature_draws_among_the_finite_scores_only() -> None:
    llm = BaseLogprobBackend(MaskedRows(), BackendConfig(), name="test")
    try:
        for temperature in (1e300, MAX_TEMPERATURE, 1e30):
            drawn = llm.sample_sync([1], max_tokens=40, temperature=temperature, seed=0, eos_token_ids=[])
            assert len(drawn) == 40 and set(drawn) == {2, 3}  # uniform over the two, never a masked one
    finally:
        llm.close()


class Recording(Engine):
    """An engine with a sampler of its own: records the requests it gets."""

    supports = frozenset({"sample"})

    def __init__(self) -> None:
        self.tokenizer = Tok()
        self.byte_vocab = [Token(i, bytes([97 + i])) for i in range(V)]
        self.requests: list[SampleRequest] = []

    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        return torch.zeros(len(contexts), V)

    def sample(self, requests: list[SampleRequest]) -> list[list[int]]:
        self.requests += requests
        return [[1] for _ in requests]


def test_an_engine_sampler_gets_the_same_temperature() -> None:
    engine = Recording()
    llm = BaseLogprobBackend(engine, BackendConfig(), name="test")
    try:
        for given, received in [(5e-324, 0.0), (1e-45, 0.0), (0, 0.0), (0.7, 0.7), (1e300, MAX_TEMPERATURE)]:
            llm.sample_sync([1], max_tokens=1, temperature=given)
            assert engine.requests[-1].temperature == received
    finally:
        llm.close()
