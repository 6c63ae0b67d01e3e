"""The defect catalogue (genlm_core.testing.defects) on the mock engine, as a third-party
plugin runs it: an exact table (``atol = 0``), whose uncached path is its forward (the
catalogue keeps that reference right). The wrong-adapter defect needs an engine with
LoRA adapters, which the mock is not."""

from __future__ import annotations

from typing import Any

import pytest

import genlm_core
from genlm_core.testing.defects import CATALOGUE
from genlm_core.testing.gates import catch, gate_settings, gates_for

pytestmark = pytest.mark.defects


@pytest.fixture(scope="module")
def backend() -> Any:
    llm = genlm_core.load("mock")
    yield llm
    llm.close()


@pytest.mark.parametrize("defect", [d for d in CATALOGUE if not d.needs_adapter], ids=str)
def test_every_gate_fails_on_the_defect(backend: Any, defect: Any) -> None:
    settings = gate_settings(backend, atol=0.0)
    gates = gates_for(backend, defect)
    assert len(gates) == 5, [g.name for g in gates]
    for gate in gates:
        caught = catch(backend, defect, gate, settings)
        assert caught.ratio is not None and caught.ratio > 1, caught  # a bound, exceeded
