"""The defect catalogue (genlm_core.testing.defects) on real vLLM (CPU, in process), the
tiny Llama in float32, bfloat16 and float16 with LoRA enabled and the 32-token step
budget of the session's engines (chunked prefill): every gate that compares rows fails
on every defect, the wrong LoRA adapter included. Starts and closes engines of its own
(``own_process``); marked ``defects``: the ISA-capped pass does not repeat it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_BUDGET
from oracles import build_lora_adapter

import genlm_core
from genlm_core.testing.defects import CATALOGUE, WrongAdapter, active_adapter
from genlm_core.testing.gates import catch, gate_settings, gates_for

pytestmark = [pytest.mark.defects, pytest.mark.own_process]


@pytest.fixture(scope="module")
def adapters(tiny_path: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root: Path = tmp_path_factory.mktemp("defect-lora")
    return [build_lora_adapter(tiny_path, root / f"a{seed}", 20.0, seed) for seed in (1, 2)]


@pytest.fixture(scope="module", params=["float32", "bfloat16", "float16"])
def backend(request: pytest.FixtureRequest, tiny_path: str, adapters: list[str]) -> Any:
    llm = genlm_core.load(
        "vllm",
        model=tiny_path,
        dtype=request.param,
        enforce_eager=True,
        max_model_len=256,
        max_num_batched_tokens=TINY_BUDGET,
        batch_size=16,
        enable_lora=True,
        max_lora_rank=8,
        engine_opts={"block_size": 32},
    )
    assert llm.dtype == request.param
    llm.load_lora(adapters[0], "active")
    yield llm
    llm.close()


@pytest.mark.parametrize("defect", [d for d in CATALOGUE if not d.needs_adapter], ids=str)
def test_every_gate_fails_on_the_defect(backend: Any, defect: Any) -> None:
    settings = gate_settings(backend)
    gates = gates_for(backend, defect)
    assert len(gates) == 5, [g.name for g in gates]  # its decode step keeps sessions, not KV reuse
    for gate in gates:
        catch(backend, defect, gate, settings)


def test_every_gate_fails_on_a_wrong_adapter(backend: Any, adapters: list[str]) -> None:
    settings = gate_settings(backend, lora_adapters=adapters)
    defect = WrongAdapter()
    gates = gates_for(backend, defect)
    assert len(gates) == 6, [g.name for g in gates]
    for gate in gates:
        if gate.name == "kit test_lora":
            catch(backend, defect, gate, settings)  # it activates adapters itself
            continue
        with active_adapter(backend, "active"):
            catch(backend, defect, gate, settings)
