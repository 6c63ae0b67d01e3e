"""The defect catalogue (genlm_core.testing.defects) on the real transformers engine: every
gate that compares rows fails on every defect, on the eager path, the static decode step
(``static_decode="on"``, ``fused_decode=False``) and the fused step (``static_decode="on"``,
the default ``fused_decode``), in float32, bfloat16 and float16.

A wrong LoRA adapter needs adapters loaded: it runs on backends of its own, eager and
static (with an adapter loaded the fused step is off by design: it reads the base
weights only, ``HFEngine.load_adapter``). Marked ``defects``: the test command's second,
ISA-capped pass (which holds correct paths 4x under their bounds) does not repeat it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hf_helpers import load_hf, make_lora_adapter

from genlm_core.testing.defects import CATALOGUE, WrongAdapter, active_adapter
from genlm_core.testing.gates import catch, gate_settings, gates_for

pytestmark = pytest.mark.defects

PATHS = {
    "eager": {"static_decode": "off"},
    "static": {"static_decode": "on", "fused_decode": False},
    "fused": {"static_decode": "on"},
}
DTYPES = ("float32", "bfloat16", "float16")
DEFECTS = [d for d in CATALOGUE if not d.needs_adapter]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    """One intra-op thread: the catalogue proves gates fail, whatever the GEMM split, and
    runs 10x faster so on a busy 2-core machine (two threads spin against other work)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _load(path: str, name: str, dtype: str) -> Any:
    llm = load_hf(path, dtype=dtype, **PATHS[name])
    if name == "fused":
        assert llm.engine.step is not None and llm.engine.step.fused, "the fused step is not on"
    elif name == "static":
        assert llm.engine.step is not None and not llm.engine.step.fused
    else:
        assert llm.engine.step is None
    return llm


@pytest.fixture(scope="module", params=[(p, d) for p in PATHS for d in DTYPES], ids="-".join)
def backend(request: pytest.FixtureRequest, tiny_llama_path: str) -> Any:
    name, dtype = request.param
    llm = _load(tiny_llama_path, name, dtype)
    yield llm
    llm.close()


@pytest.mark.parametrize("defect", DEFECTS, ids=str)
def test_every_gate_fails_on_the_defect(backend: Any, defect: Any) -> None:
    settings = gate_settings(backend)
    gates = gates_for(backend, defect)
    # genlm-hf's bursts are ordinary calls: no check_decode_batches gate applies
    assert len(gates) == 5, [g.name for g in gates]
    for gate in gates:
        catch(backend, defect, gate, settings)


@pytest.fixture(scope="module")
def adapters(tiny_llama_path: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("defect-lora")
    return [str(make_lora_adapter(tiny_llama_path, root / f"a{seed}", seed)) for seed in (1, 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["eager", "static"])
def test_every_gate_fails_on_a_wrong_adapter(
    tiny_llama_path: str, adapters: list[str], name: str, dtype: str
) -> None:
    """With an adapter active every gate fails when the engine computes under another one
    (the base model); ``test_lora`` (switching adapters itself) fails too. (genlm-hf's
    bursts are ordinary calls: no ``check_decode_batches`` gate applies.)"""
    llm = load_hf(tiny_llama_path, dtype=dtype, **PATHS[name])
    try:
        llm.load_lora(adapters[0], "active")
        settings = gate_settings(llm, lora_adapters=adapters)
        defect = WrongAdapter()
        gates = gates_for(llm, defect)
        assert len(gates) == 6, [g.name for g in gates]  # the six above and test_lora
        for gate in gates:
            if gate.name == "kit test_lora":
                catch(llm, defect, gate, settings)  # it activates adapters itself
                continue
            with active_adapter(llm, "active"):
                catch(llm, defect, gate, settings)
    finally:
        llm.close()


def test_a_defects_own_rows_leave_the_engines_counters(llama: Any) -> None:
    """The rows a defect computes to stand in (the uncached model's) are not the engine's
    work: check_decode_batches counts the tokens an engine ran, and must count the same
    with a defect applied."""
    from genlm_core.testing.defects import StaleRow, inject

    with inject(llama, StaleRow()) as inj:
        before = llama.tokens_computed
        inj.reference([(1, 2, 3, 4)])
        assert llama.tokens_computed == before
