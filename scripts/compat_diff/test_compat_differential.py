"""genlm-compat against genlm-backend 0.3.1 + genlm-bytes 0.2.0, call for call.

``cases.py`` runs in the reference venv (``$GENLM_REFERENCE_PYTHON``; in a source
checkout without it, a venv built from PyPI under ``build/compat-diff``) and in this
interpreter (genlm-compat as installed here: ``scripts/test_artifacts.py`` runs this
file in a venv made from the built wheels). Every observation must agree, except the
intended differences of ``allowed.py`` (which must still differ: no stale entries).
Every call of the two releases' documented API is a case, and every public name of
genlm-compat's modules that the releases have (``reference_names.json``) is exercised by
a case.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if not (HERE / "tokenizers_fixtures.py").exists():  # a source checkout: the core suites' copy
    sys.path.insert(0, str(HERE.parents[1] / "tests"))

import allowed  # noqa: E402
from recording import differences  # noqa: E402

ISSUE_ROWS = set(range(1, 16))
#: in the repository; scripts/test_artifacts.py copies these files next to this one
SOURCES = {
    "reference_names.json": "plugins/genlm_compat/tests/reference_names.json",
    "migration.md": "docs/migration.md",
}


def source(name: str) -> Path:
    here = HERE / name
    return here if here.exists() else HERE.parents[1] / SOURCES[name]


def reference_python() -> Path:
    """``$GENLM_REFERENCE_PYTHON``, else a venv with the pins of
    ``scripts/test_artifacts.py``'s ``compat-diff`` set (built on first use)."""
    if "GENLM_REFERENCE_PYTHON" in os.environ:
        return Path(os.environ["GENLM_REFERENCE_PYTHON"])
    root = HERE.parents[1]
    sys.path.insert(0, str(root / "scripts"))
    sys.path.insert(0, str(root / "benchmarks"))
    from common import ensure_venv
    from test_artifacts import REFERENCE_CONSTRAINTS, REFERENCE_PINS, torch_pin

    check = "import genlm.backend, genlm.bytes, peft"
    pins = [*REFERENCE_PINS, *REFERENCE_CONSTRAINTS]
    saved = os.environ.pop("PYTHONPATH", None)  # the probe must see the venv's own packages only
    try:
        return ensure_venv(root / "build" / "compat-diff" / "reference-venv", torch_pin("3.11"), pins, check)
    finally:
        if saved is not None:
            os.environ["PYTHONPATH"] = saved


def cases() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(HERE / "cases.py"), "--list"], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def run_side(python: Path, models: Path, names: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [str(python), str(HERE / "cases.py"), str(models), *names],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=HERE,
    )  # fmt: skip


def collect(proc: subprocess.Popen, names: list[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=1800)
    lines = [ln for ln in out.splitlines() if ln.startswith("RECORDS ")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1].removeprefix("RECORDS "))
    crash = {"process": {"exit": proc.returncode, "stderr": err[-1500:]}}
    return {n: crash for n in names}


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """``{"reference": ..., "compat": ...}``: every case, both sides run at the same time;
    an isolated case runs in a process of its own (a crash ends only it)."""
    import models

    paths = models.build_all(tmp_path_factory.mktemp("compat-diff-models"))
    models_json = Path(paths["gpt2-1024"]).parent / "models.json"
    listed = cases()
    shared = [n for n, c in listed.items() if not c["isolated"]]
    groups = [shared] + [[n] for n, c in listed.items() if c["isolated"]]
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    base.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    ref_env = {k: v for k, v in base.items() if k != "PYTHONPATH"}
    ref_python = reference_python()
    out: dict[str, dict[str, Any]] = {"reference": {}, "compat": {}}
    for names in groups:
        procs = {
            "reference": run_side(ref_python, models_json, names, ref_env),
            "compat": run_side(Path(sys.executable), models_json, names, base),
        }
        for side, proc in procs.items():
            out[side].update(collect(proc, names))
    summary = {"cases": len(listed), "observations": sum(len(v) for v in out["reference"].values()),
               "allowed differences": len(allowed.ALLOWED)}  # fmt: skip
    (tmp_path_factory.getbasetemp() / "compat-diff-summary.json").write_text(json.dumps(summary))
    report = os.environ.get("GENLM_COMPAT_DIFF_REPORT")
    if report:
        Path(report).write_text(json.dumps(summary) + "\n")
    return out


def test_every_row_and_public_name_has_a_case() -> None:
    listed = cases()
    rows = {r for c in listed.values() for r in c["rows"]}
    assert ISSUE_ROWS <= rows, f"issue rows without a case: {sorted(ISSUE_ROWS - rows)}"
    covered = {n for c in listed.values() for n in c["names"]}
    surface = json.loads(source("reference_names.json").read_text())["modules"]
    names = {n for ns in surface.values() for n in ns}
    for module in surface:  # genlm-compat's public names in the same modules
        mod = importlib.import_module(module)
        names |= set(getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")])
    missing = sorted(names - covered)
    assert not missing, f"public names no case exercises (add them to a case in cases.py): {missing}"


def test_allowed_differences_name_real_observations() -> None:
    listed = cases()
    for entry in allowed.ALLOWED:
        assert entry.case in listed, entry
        assert entry.what and entry.reference and entry.compat, entry


def test_reference_and_compat_agree(records: dict[str, dict[str, Any]]) -> None:
    ref, got = records["reference"], records["compat"]
    permitted = allowed.lookup()
    problems = []
    for case, observations in ref.items():
        for name in sorted(set(observations) | set(got.get(case, {}))):
            a, b = observations.get(name), got.get(case, {}).get(name)
            if a is None or b is None or "error" in (a or {}) or "process" in (a or {}):
                problems.append(f"{case}.{name}: reference {_brief(a)} / genlm-compat {_brief(b)}")
                continue
            diff = differences(a, b)
            if diff and (case, name) not in permitted:
                problems.append(f"{case}.{name}: {diff[0]}")
            elif not diff and (case, name) in permitted:
                problems.append(f"{case}.{name}: listed in allowed.py but agrees now (remove the entry)")
    assert not problems, "\n".join(problems)


def test_migration_doc_lists_the_allowed_differences() -> None:
    text = source("migration.md").read_text()
    start, end = text.find(allowed.BEGIN), text.find(allowed.END)
    assert 0 <= start < end, f"docs/migration.md lacks the markers {allowed.BEGIN!r} ... {allowed.END!r}"
    assert text[start : end + len(allowed.END)] == allowed.markdown(), (
        "docs/migration.md's list of intended differences is out of date: paste the output of "
        "`python scripts/compat_diff/allowed.py` between its markers"
    )


def _brief(x: Any) -> str:
    text = json.dumps(x)
    return text if len(text) < 300 else text[:297] + "..."
