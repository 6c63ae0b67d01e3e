"""The GPU check's plan (scripts/gpu_check.py): every figure of the speed targets table
(scripts/gpu_targets.py) is read from a benchmark run the check makes before its optional ones, and a run the
budget leaves out fails the check unless it is optional. The plan's tables come from
benchmarks/workloads.py, one entry a workload."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402
import gpu_targets  # noqa: E402


def _written(tmp: Path, plan: list[tuple[str, str]]) -> None:
    """Results files as the plan's runs would write them, each with a figure in it."""
    import json

    for name, tag in plan:
        if name in gpu_check.SCRIPTS:  # another run of a benchmark, saved under its own name
            saved, name = f"{name}-{tag}.json", gpu_check.SCRIPTS[name]
        else:
            saved = f"{gpu_check.WRITES.get(name, name)}-{tag}.json"
        data = {
            "hf_step": {"rows": [{"rows": 64, "step_ms": 1.0}]},
            "burst": {"rows": [{"engine": "hf", "mode": "burst", "particles": 64, "calls_per_s": 9e3}]},
            "sis": {"hf": {"sweep_speedup_vs_genlm_backend": {"64": 2.0}}},
            "bytes": {"rows": [{"K": 5, "(a) bytes/s": 100.0}]},  # no target reads it
            "serve": {
                "figures": {
                    "b_over_a_calls_per_s": 1.2,
                    "b_over_a_gpu_memory": 0.3,
                    "b_over_a_calls_per_s_unwaited": 1.4,
                }
            },
            "many_programs": {
                "figures": {"together_over_sequential": 0.95, "memory_together_over_alone": 1.2}
            },
        }[name]
        (tmp / saved).write_text(json.dumps(data))


def test_the_required_runs_give_every_target(tmp_path: Path) -> None:
    required = [p for p in gpu_check.PLAN if p not in gpu_check.OPTIONAL]
    first = gpu_check.PLAN[: len(required)]
    assert first == required  # the optional runs come last
    _written(tmp_path, required)
    rows = gpu_targets.targets(tmp_path, dry=False)
    # the 1.7B serve figures are read from an optional run: every other one is there
    missing = [r["figure"] for r in rows if r["value"] is None]
    assert missing == [r["figure"] for r in rows if r["figure"].startswith("serve 1.7B")]
    assert all(r["met"] for r in rows if r["value"] is not None and not r.get("info"))
    # the serve bound is listed, not judged
    (info,) = [r for r in rows if r.get("info")]
    assert info["value"] == 1.4 and info["met"] is None and "135M" in info["figure"]
    assert "| 1.4 |  |  |" in "\n".join(gpu_targets.markdown(rows, dry=False))
    _written(tmp_path, gpu_check.PLAN)
    assert all(r["value"] is not None for r in gpu_targets.targets(tmp_path, dry=False))


def test_a_spent_budget_fails_only_required_runs(tmp_path: Path) -> None:
    args = argparse.Namespace(out=tmp_path, budget=10.0, started=time.time() - 10.0, dry_run_cpu=True)
    check = gpu_check.Check(args)
    required = check.run(gpu_check.Step("burst x", ["true"], cap_s=60))
    optional = check.run(gpu_check.Step("sis y", ["true"], cap_s=60, optional=True))
    assert required.rc is None and "spent" in required.note  # counted as failed by report()
    assert optional.rc == 0 and "optional" in optional.note
    # an optional run with less than half its cap left is left out too; a required one runs
    check.deadline = time.time() + 40.0  # 40 s left
    ran = check.run(gpu_check.Step("hf_step z", [sys.executable, "-c", "pass"], cap_s=60))
    left = check.run(gpu_check.Step("serve w", [sys.executable, "-c", "pass"], cap_s=90, optional=True))
    assert ran.rc == 0 and left.rc == 0 and "optional" in left.note


def test_every_run_is_a_workloads_script_on_a_model_the_check_builds() -> None:
    from workloads import WORKLOADS  # benchmarks/ is on sys.path: gpu_check put it there

    tags = {tag for _shape, tag, _dtype in gpu_check.GPU_MODELS}
    assert {tag for _name, tag in gpu_check.PLAN} <= tags
    assert set(gpu_check.SIZES) == {name for name, _tag in gpu_check.PLAN}  # every run has a place
    assert len(set(gpu_check.PLAN)) == len(gpu_check.PLAN)
    for name in gpu_check.SIZES:
        script = ROOT / "benchmarks" / f"bench_{gpu_check.SCRIPTS.get(name, name)}.py"
        assert script.is_file(), name
        assert name in gpu_check.CAPS
    scripts = {w.script for w in WORKLOADS}
    assert all((ROOT / "benchmarks" / s).is_file() for s in scripts)
