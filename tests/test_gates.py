"""The gates that are kit tests hold the kit's methods themselves, not their names: a
renamed kit test must break ``genlm_core.testing.gates`` at import, where every plugin's
defect run sees it, not at the first run of the gate on a real engine."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from genlm_core.testing import gates
from genlm_core.testing.conformance import LogprobBackendConformance
from genlm_core.testing.gates import GATES, GateSettings, KitTest


def _kit_gates() -> list[gates.Gate]:
    return [g for g in GATES if isinstance(g.run, KitTest)]


def _load_gates_afresh(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Execute gates.py as a new module (the imported one stays as it is)."""
    name = "genlm_core.testing._gates_loaded_afresh"
    spec = importlib.util.spec_from_file_location(name, gates.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_each_kit_gate_holds_the_kit_method_its_label_names() -> None:
    kit_gates = _kit_gates()
    assert kit_gates, "no gate runs a kit test"
    for gate in kit_gates:
        test = gate.run.test
        assert getattr(LogprobBackendConformance, test.__name__) is test
        assert test.__name__ in gate.name  # the label a report prints names what ran


def test_a_renamed_kit_test_fails_the_import(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _load_gates_afresh(monkeypatch).GATES  # the file loads afresh while the kit is whole
    for gate in _kit_gates():
        name = gate.run.test.__name__
        with monkeypatch.context() as m:
            m.delattr(LogprobBackendConformance, name)
            with pytest.raises(AttributeError, match=name):
                _load_gates_afresh(m)


def test_a_kit_gate_runs_the_settings_kit_override() -> None:
    ran: list[tuple[str, Any, int]] = []

    class Kit(LogprobBackendConformance):
        def test_batch_equals_single(self, backend: Any) -> None:
            ran.append(("sync", backend, self.n_contexts))

        async def test_async_equals_sync(self, backend: Any) -> None:
            ran.append(("async", backend, self.n_contexts))

    settings = GateSettings(n_contexts=3, min_len=1, max_len=2, prompt=(), kit=Kit)
    backend = object()
    KitTest(LogprobBackendConformance.test_batch_equals_single)(backend, settings)
    KitTest(LogprobBackendConformance.test_async_equals_sync)(backend, settings)
    assert ran == [("sync", backend, 3), ("async", backend, 3)]
