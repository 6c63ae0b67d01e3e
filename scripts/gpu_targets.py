"""The GPU speed targets, read from a GPU check's results folder: the hf step's time at 64
rows on both models, SIS against genlm-backend and the burst's calls/s at 64 particles on
the 1.7B, genlm serve against a backend per process (calls/s and GPU memory), the 64-row
step over a 2,048-token prompt against the 28-token one, and many programs with their own
long prompts on one engine (calls/s against one by one, peak GPU memory); the figures the
GPU work set out to reach (docs/gpu.md lists them with each check's values).

scripts/gpu_check.py puts this table at the top of ``summary.md`` and into ``check.json``:
each figure, its target, and whether it is met. The figures come from the results the
check's benchmarks wrote (``<benchmark>-<model tag>.json``); a figure whose result is
missing is listed as missing, not met. In a dry run on the CPU the tiny model stands in
for both models and the largest row/particle count it ran for 64: the table then checks
the reading, and nothing is judged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the model tags of a GPU run (scripts/gpu_check.py's GPU_MODELS)
LARGE, SMALL = "smollm2-1.7b-bf16", "smollm2-135m-f32"


def _load(out: Path, name: str) -> Any:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _at(rows: list[dict], key: str, want: int, dry: bool) -> dict | None:
    """The row whose ``key`` is ``want`` (in a dry run: the largest there is)."""
    rows = [r for r in rows if isinstance(r.get(key), int)]
    if dry and rows:
        return max(rows, key=lambda r: r[key])
    return next((r for r in rows if r[key] == want), None)


def hf_step_ms(out: Path, tag: str, dry: bool) -> float | None:
    data = _load(out, f"hf_step_grow-{tag}")
    row = _at(data["rows"], "rows", 64, dry) if data else None
    return row.get("step_ms") if row else None


def prompt_step_ratio(out: Path, tag: str, dry: bool) -> float | None:
    """The 64-row step over a 2,048-token shared prompt (``hf_step_prompt``) against the
    step over the 28-token one (``hf_step_grow``), at the same row count."""
    long = _load(out, f"hf_step_prompt-{tag}")
    row = _at(long["rows"], "rows", 64, dry) if long else None
    short = hf_step_ms(out, tag, dry) if row else None
    if not row or not short or row.get("step_ms") is None:
        return None
    return row["step_ms"] / short


def many_programs(out: Path, tag: str, key: str) -> float | None:
    data = _load(out, f"many_programs-{tag}")
    return ((data or {}).get("figures") or {}).get(key)


def sis_ratio(out: Path, tag: str, dry: bool) -> float | None:
    data = _load(out, f"sis-{tag}")
    rec = (data or {}).get("hf") or {}
    ratios = rec.get("sweep_speedup_vs_genlm_backend") or {}
    if dry and ratios:
        return ratios[max(ratios, key=int)]
    return ratios.get("64")


def burst_calls(out: Path, tag: str, dry: bool) -> float | None:
    data = _load(out, f"burst-{tag}")
    rows = [r for r in (data or {}).get("rows", []) if r.get("engine") == "hf" and r.get("mode") == "burst"]
    row = _at(rows, "particles", 64, dry)
    return row.get("calls_per_s") if row else None


def serve_figure(out: Path, tag: str, key: str) -> float | None:
    data = _load(out, f"serve-{tag}")
    return ((data or {}).get("figures") or {}).get(key)


def targets(out: Path, dry: bool, tiny: str = "tiny-llama-f32") -> list[dict[str, Any]]:
    """One row per target figure: ``figure``, ``value``, ``target`` and ``met`` (True,
    False, or None where the figure is missing or the run is a dry run)."""
    large, small = (tiny, tiny) if dry else (LARGE, SMALL)
    specs = [
        ("hf step, 64 rows, 1.7B bf16 (ms)", hf_step_ms(out, large, dry), "<=", 10.0),
        ("hf step, 64 rows, 135M f32 (ms)", hf_step_ms(out, small, dry), "<=", 5.0),
        ("SIS, 64 particles, 1.7B: genlm-hf / genlm-backend", sis_ratio(out, large, dry), ">=", 1.5),
        ("burst, 64 particles, 1.7B (calls/s)", burst_calls(out, large, dry), ">=", 3000.0),
        (
            "hf step, 64 rows, 1.7B bf16: 2,048-token prompt / 28-token prompt",
            prompt_step_ratio(out, large, dry),
            "<=",
            2.0,
        ),
        (
            "many programs (8 x 900-token prompts x 16 x 30), 135M: calls/s together / one by one",
            many_programs(out, small, "together_over_sequential"),
            ">=",
            0.9,
        ),
        (
            "many programs, 135M: peak GPU memory together / the largest alone",
            many_programs(out, small, "memory_together_over_alone"),
            "<=",
            1.5,
        ),
    ]
    for tag, label in ((small, "135M f32"), (large, "1.7B bf16")):
        specs.append(
            (f"serve {label}: (b)/(a) calls/s", serve_figure(out, tag, "b_over_a_calls_per_s"), ">=", 1.0)
        )
        specs.append(
            (f"serve {label}: (b)/(a) GPU memory", serve_figure(out, tag, "b_over_a_gpu_memory"), "<=", 0.4)
        )
    rows = []
    for figure, value, op, bound in specs:
        met = None
        if value is not None and not dry:
            met = value <= bound if op == "<=" else value >= bound
        rows.append({"figure": figure, "value": value, "target": f"{op} {bound:g}", "met": met})
    for tag, label in ((small, "135M f32"), (large, "1.7B bf16")):
        # not a target: the (b)/(a) the same passes and wire would give if no request waited
        value = serve_figure(out, tag, "b_over_a_calls_per_s_unwaited")
        if value is not None:
            rows.append(
                {
                    "figure": f"serve {label}: (b)/(a) calls/s if no request waited (bench_serve's bound)",
                    "value": value,
                    "target": "",
                    "met": None,
                    "info": True,
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]], dry: bool) -> list[str]:
    def cell(row: dict[str, Any]) -> str:
        if row.get("info"):
            return ""
        if row["value"] is None:
            return "missing"
        return "dry run" if dry else ("yes" if row["met"] else "**no**")

    lines = [
        "## Targets (issue 44, item 3; issue 69, items 3 and 6)",
        "",
        "| figure | value | target | met |",
        "|---|---:|---|---|",
    ]
    for r in rows:
        value = "-" if r["value"] is None else f"{r['value']:.4g}"
        lines.append(f"| {r['figure']} | {value} | {r['target']} | {cell(r)} |")
    if dry:
        lines += [
            "",
            "A dry run on the CPU: the tiny model's figures, read as the GPU run's would be; not judged.",
        ]
    return [*lines, ""]
