"""The defect catalogue (genlm_core.testing.defects) on real llama.cpp, the tiny Llama's
F32 GGUF with an f32, f16 and bf16 KV cache (``dtype`` float32, float16, bfloat16): every
gate that compares rows fails on every defect. llama.cpp loads no LoRA adapter here (the
engine does not declare the capability), so the wrong-adapter defect has no engine to
run on. Marked ``defects``: the test command's ISA-capped pass does not repeat it."""

from __future__ import annotations

from typing import Any

import pytest

import genlm_core
from genlm_core.testing.defects import CATALOGUE
from genlm_core.testing.gates import catch, gate_settings, gates_for

pytestmark = pytest.mark.defects


@pytest.fixture(scope="module", params=["float32", "float16", "bfloat16"])
def backend(request: pytest.FixtureRequest, tiny_gguf: Any) -> Any:
    llm = genlm_core.load("llamacpp", model=str(tiny_gguf), dtype=request.param, n_threads=1)
    assert llm.dtype == request.param
    yield llm
    llm.close()


@pytest.mark.parametrize("defect", [d for d in CATALOGUE if not d.needs_adapter], ids=str)
def test_every_gate_fails_on_the_defect(backend: Any, defect: Any) -> None:
    settings = gate_settings(backend)
    gates = gates_for(backend, defect)
    assert len(gates) == 5, [g.name for g in gates]  # no decode batches of its own
    for gate in gates:
        catch(backend, defect, gate, settings)


def test_the_catalogue_names_what_llamacpp_cannot_hold(tiny_gguf: Any) -> None:
    """The wrong-adapter defect needs the capability "lora", which llama.cpp's engine does
    not declare: the backend refuses an adapter, so no gate can meet that defect here."""
    llm = genlm_core.load("llamacpp", model=str(tiny_gguf), dtype="float32", n_threads=2)
    try:
        assert not llm.supports_lora
        with pytest.raises(NotImplementedError, match="LoRA"):
            llm.load_lora("/nonexistent", "x")
    finally:
        llm.close()
