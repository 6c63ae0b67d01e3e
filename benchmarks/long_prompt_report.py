"""``bench_long_prompt.py``'s report: its JSON and Markdown, its verdicts and its smoke checks.

Standard library only (``run_all.py`` imports the benchmark for its verdicts, which must
load no engine). The record (``long_prompt.json``) holds one entry per engine and shape
in ``runs``; the Markdown puts every engine side by side per shape.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import long_prompts
import verdicts
from common import machine, markdown_table

#: genlm-hf's targets at long prompts, read at long_prompts.HEADLINE and WITHIN_2X: a long
#: prompt shared by many particles must cost what the engines built for it cost (llama.cpp's
#: shared KV cells, vLLM's prefix cache), be computed about once, and slow a step down at
#: most twice against the 3-token prompt
TARGETS = {
    "hf_calls_per_s_min": 170.0,
    "hf_over_llamacpp_min": 1.0,
    "hf_over_vllm_min": 0.9,
    "hf_tokens_over_minimum_max": 1.05,
    "hf_peak_rss_gb_max": 1.5,
    "long_over_short_prompt_slowdown_max": 2.0,
}
GB = 1e9


# ---------------------------------------------------------------------- the record
def write_report(
    args: argparse.Namespace, runs: list[dict[str, Any]], previous: dict[str, Any] | None, model: str
) -> dict[str, Any]:
    """``long_prompt.json`` and ``long_prompt.md`` next to ``args.out``; the record.
    ``previous`` (``--merge``): its runs of other engine/shape pairs are kept."""
    mine = {(r["engine"], r["shape"]) for r in runs}
    kept = [r for r in (previous or {}).get("runs", []) if (r["engine"], r["shape"]) not in mine]
    record = {
        "benchmark": "long_prompt",
        "machine": machine(),
        "model": Path(model).name,
        "settings": {
            "threads": args.threads,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "seed": args.seed,
            "resampling": args.resampling,
            "vllm_kv_gib": args.vllm_kv_gib,
            "time_cap_s": args.time_cap,
            "cap_all": args.cap_all,
            "device": args.device,
            "dtype": args.dtype,
            "smoke": args.smoke,
            "quick": args.quick,
        },
        "targets": TARGETS,
        "runs": kept + runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    md = markdown(record)
    args.out.with_suffix(".md").write_text(md + "\n")
    print(md)
    print(f"\n(JSON: {args.out})")
    return record


def _shapes(record: dict[str, Any]) -> list[str]:
    names = dict.fromkeys(r["shape"] for r in record["runs"])
    return sorted(names, key=lambda n: long_prompts.parse_shapes([n])[0].sort_key())


def _engines(record: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["engine"] for r in record["runs"]))


def find(record: dict[str, Any], engine: str, shape: str | long_prompts.Shape) -> dict[str, Any] | None:
    name = shape if isinstance(shape, str) else shape.name
    return next((r for r in record.get("runs", []) if r["engine"] == engine and r["shape"] == name), None)


def ok(run: dict[str, Any] | None) -> bool:
    return bool(run) and run.get("status") == "ok"


def ratio_to_minimum(run: dict[str, Any]) -> float | None:
    tc, least = run.get("tokens_computed"), run.get("minimum_tokens")
    return tc / least if tc is not None and least else None


def outside_engine_s(run: dict[str, Any]) -> float | None:
    return run["wall_s"] - run["engine_s"] if run.get("engine_s") is not None else None


# ---------------------------------------------------------------------- Markdown
def _cell(run: dict[str, Any] | None, what: str) -> str:
    if run is None:
        return ""
    if not ok(run):
        status = str(run.get("status", "?"))
        prog = run.get("progress") or {}
        if status.startswith("did not finish") and prog.get("phase", "").startswith("run"):
            if what == "calls/s":
                rate = prog["calls"] / prog["elapsed_s"] if prog.get("elapsed_s") else 0.0
                return f"{status} ({prog['calls']} calls, {rate:.2f}/s so far)"
            if what == "peak RSS" and prog.get("peak_rss_bytes"):
                return f"{prog['peak_rss_bytes'] / GB:.2f} when stopped"
        return status.split(":")[0] if what != "calls/s" else status[:80]
    if what == "calls/s":
        return f"{run['calls_per_s']:.1f}"
    if what == "x min":
        r = ratio_to_minimum(run)
        return "-" if r is None else f"{r:.2f} ({run['tokens_computed']:,} / {run['minimum_tokens']:,})"
    if what == "peak RSS":
        return f"{run['memory']['peak_bytes'] / GB:.2f}"
    if what == "outside":
        out = outside_engine_s(run)
        return "-" if out is None else f"{out:.1f} of {run['wall_s']:.1f}"
    raise ValueError(what)


def markdown(record: dict[str, Any]) -> str:
    shapes, engines = _shapes(record), _engines(record)
    st = record["settings"]
    lines = [
        "## long prompts shared by many particles (bench_long_prompt.py)",
        "",
        f"Model {record['model']}, {st['threads']} threads, warm-up {st['warmup']}, "
        f"{st['repeats']} timed run(s) per shape (median), seed {st['seed']}, SMC resampling "
        f"{st['resampling']}, vLLM KV space {st['vllm_kv_gib']} GiB, reference capped at "
        f"{st['time_cap_s']:.0f} s; {record['machine'].get('cpu', '')}, "
        f"load {record['machine'].get('load_avg_1m', 0):.2f}, {record['machine']['date']}.",
        "",
        "Shapes are PROMPTxPARTICLESxTOKENS:PROGRAM (prompt in SmolLM2 tokens).",
    ]
    tables = (
        ("calls/s", "calls/s"),
        ("x min", "tokens computed / the minimum (the distinct prefixes the run asked for)"),
        ("peak RSS", "peak RSS of the engine's process, GB"),
        ("outside", "seconds outside the engine's batch function, of the wall time"),
    )
    for what, title in tables:
        rows = [{"shape": s, **{e: _cell(find(record, e, s), what) for e in engines}} for s in shapes]
        lines += ["", f"### {title}", "", markdown_table(rows, ["shape", *engines])]
    lines += ["", "### every run", "", markdown_table([detail(r) for r in _ordered(record)], DETAIL)]
    return "\n".join(lines)


DETAIL = [
    "shape",
    "engine",
    "status",
    "calls",
    "wall s",
    "calls/s",
    "tokens computed",
    "minimum",
    "x min",
    "peak RSS GB",
    "runs' peak GB",
    "GPU GB",
    "engine s",
    "outside engine s",
    "program ms/call",
    "steps",
    "resamples",
    "died",
    "load s",
    "device",
]


def _ordered(record: dict[str, Any]) -> list[dict[str, Any]]:
    shapes, engines = _shapes(record), _engines(record)
    return sorted(record["runs"], key=lambda r: (shapes.index(r["shape"]), engines.index(r["engine"])))


def detail(run: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"shape": run["shape"], "engine": run["engine"], "status": run.get("status", "")}
    if not ok(run):
        prog = run.get("progress") or {}
        stopped = str(run.get("status", "")).startswith("did not finish")
        if stopped and prog.get("phase"):  # what it did: its phase's calls and time, its peak so far
            row.update(
                {
                    "calls": f"{prog.get('calls', 0)} ({prog['phase']})",
                    "wall s": prog.get("elapsed_s", ""),
                    "peak RSS GB": prog["peak_rss_bytes"] / GB if prog.get("peak_rss_bytes") else "",
                }
            )
        return row
    mem, prog, res = run["memory"], run["program_account"], run.get("program_result") or {}
    r = ratio_to_minimum(run)
    row.update(
        {
            "calls": run["calls"],
            "wall s": run["wall_s"],
            "calls/s": run["calls_per_s"],
            "tokens computed": run["tokens_computed"] if run["tokens_computed"] is not None else "-",
            "minimum": run["minimum_tokens"],
            "x min": r if r is not None else "-",
            "peak RSS GB": mem["peak_bytes"] / GB,
            "runs' peak GB": mem["run_peak_bytes"] / GB if mem.get("run_peak_bytes") else "-",
            "GPU GB": mem["gpu_max_allocated_bytes"] / GB if "gpu_max_allocated_bytes" in mem else "-",
            "engine s": run["engine_s"] if run.get("engine_s") is not None else "-",
            "outside engine s": outside_engine_s(run) if run.get("engine_s") is not None else "-",
            "program ms/call": prog["copy_ms_per_call"] + prog["sample_ms_per_call"],
            "steps": run["steps"],
            "resamples": res.get("resamples", "-"),
            "died": res.get("died", "-"),
            "load s": run["load_s"],
            "device": (run.get("device") or {}).get("device", ""),
        }
    )
    return row


# ---------------------------------------------------------------------- verdicts
def headline(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets (:data:`TARGETS`) for genlm-hf (defaults) at the headline shape, against
    llama.cpp, vLLM and genlm-backend measured in the same run; the long prompts'
    slowdown against the 3-token prompt; the worst tokens-computed ratio."""
    tg = {**TARGETS, **result.get("targets", {})}
    shape = long_prompts.HEADLINE
    at = f"long prompt {shape.prompt}x{shape.particles}x{shape.tokens} SIS"
    hf = find(result, "hf", shape)
    rows: list[dict[str, Any]] = []
    if hf is None:
        return rows
    if not ok(hf):
        return [
            verdicts.row(
                f"{at}: genlm-hf calls/s",
                hf.get("status"),
                target=f">= {tg['hf_calls_per_s_min']:g}",
                met=False,
            )
        ]
    ours = hf["calls_per_s"]
    want = tg["hf_calls_per_s_min"]
    rows.append(verdicts.row(f"{at}: genlm-hf calls/s", ours, target=f">= {want:g}", met=ours >= want))
    for engine, label, key in (
        ("llamacpp", "genlm-llamacpp f16", "hf_over_llamacpp_min"),
        ("vllm", "genlm-vllm", "hf_over_vllm_min"),
        ("reference", "genlm-backend 0.3.1", None),
    ):
        other = find(result, engine, shape)
        if other is None:
            continue
        if not ok(other):
            rows.append(verdicts.row(f"{at}: genlm-hf vs {label}, calls/s", ours, other.get("status")))
            continue
        r = ours / other["calls_per_s"]
        target = f">= {tg[key]:g}x" if key else ""
        rows.append(
            verdicts.row(
                f"{at}: genlm-hf vs {label}, calls/s",
                ours,
                other["calls_per_s"],
                r,
                target,
                r >= tg[key] if key else None,
            )
        )
    r = ratio_to_minimum(hf)
    if r is not None:
        most = tg["hf_tokens_over_minimum_max"]
        rows.append(
            verdicts.row(
                f"{at}: genlm-hf tokens computed / minimum",
                hf["tokens_computed"],
                hf["minimum_tokens"],
                r,
                f"<= {most:g}x",
                r <= most,
            )
        )
    peak = hf["memory"]["peak_bytes"] / GB
    rows.append(
        verdicts.row(
            f"{at}: genlm-hf peak RSS, GB", peak, target=f"<= {tg['hf_peak_rss_gb_max']:g}",
            met=peak <= tg["hf_peak_rss_gb_max"],
        )
    )  # fmt: skip
    for long in long_prompts.WITHIN_2X:
        short = long_prompts.Shape("3", long.particles, long.tokens, long.program)
        a, b = find(result, "hf", long), find(result, "hf", short)
        if not (a and b):
            continue
        name = f"long prompt {long.prompt}x{long.particles}x{long.tokens} SIS: genlm-hf calls/s vs the 3-token prompt"
        most = tg["long_over_short_prompt_slowdown_max"]
        if not (ok(a) and ok(b)):
            rows.append(
                verdicts.row(
                    name, a.get("status"), b.get("status"), target=f"slowdown <= {most:g}x", met=False
                )
            )
            continue
        slow = b["calls_per_s"] / a["calls_per_s"]
        rows.append(
            verdicts.row(
                name, a["calls_per_s"], b["calls_per_s"], slow, f"slowdown <= {most:g}x", slow <= most
            )
        )
    ratios = [(ratio_to_minimum(r), r["shape"]) for r in result["runs"] if r["engine"] == "hf" and ok(r)]
    ratios = [(x, s) for x, s in ratios if x is not None]
    if len(ratios) > 1:
        worst, where = max(ratios)
        most = tg["hf_tokens_over_minimum_max"]
        rows.append(
            verdicts.row(
                f"long prompts: genlm-hf worst tokens computed / minimum ({where}, of {len(ratios)} shapes)",
                worst,
                target=f"<= {most:g}x",
                met=worst <= most,
            )
        )
    return rows


# ---------------------------------------------------------------------- smoke
#: engines whose counters the smoke run judges: genlm-hf (the one the targets are for) and llama.cpp's
#: sequences sharing KV cells (its path that already holds a prompt once)
SMOKE_JUDGED = ("hf", "llamacpp")
#: the most passes over genlm-hf's KV pool a batch may take in the long-prompt workloads (a
#: round for a new shared prompt, one for the rows past it)
PASSES_PER_BATCH = 2


def smoke(result: dict[str, Any]) -> list[str]:
    """Counters that show a shared prompt stopped being shared (never timings), for every
    run of hf and llamacpp in ``result``:

    - tokens computed at most 1.05x the minimum (a particle computing the prompt again
      costs N x the prompt's tokens);
    - the runs' peak RSS above the RSS after the load at most N/2 x the prompt's KV bytes
      (the model's config and the engine's KV dtype): an engine that holds a copy of the
      prompt for more than half of its N particles exceeds it; one that holds it once
      grows by one prompt's KV plus what a forward pass over the prompt needs;
    - genlm-hf's passes over its KV pool at most :data:`PASSES_PER_BATCH` per batch the
      batcher ran (a call runs a round per level of shared new prefixes: a prompt and its
      particles, two; a call that ran a pass per token of a nested context ran hundreds).

    Any run that did not finish is a problem (CI requires every backend)."""
    problems = []
    most = {**TARGETS, **result.get("targets", {})}["hf_tokens_over_minimum_max"]
    for run in result.get("runs", []):
        name = f"long-prompt {run['engine']} {run['shape']}"
        if not ok(run):
            problems.append(f"{name}: {run.get('status')}")
            continue
        if run["kind"] not in SMOKE_JUDGED:
            continue
        r = ratio_to_minimum(run)
        if r is None or r > most:
            problems.append(
                f"{name}: {run.get('tokens_computed')} tokens computed for a minimum of "
                f"{run['minimum_tokens']} ({r if r is None else round(r, 2)}x > {most}x: the prefix is computed again)"
            )
        passes, batches = (
            (run.get("counters") or {}).get("engine.pool_passes"),
            (run.get("counters") or {}).get("batcher.batches"),
        )
        if passes is not None and batches and passes > PASSES_PER_BATCH * batches:
            problems.append(
                f"{name}: {passes:.0f} passes over the KV pool for {batches:.0f} batches (more than "
                f"{PASSES_PER_BATCH} a batch: a call runs passes per token)"
            )
        mem, kv = run["memory"], run.get("kv_bytes_per_token")
        if not kv:
            problems.append(f"{name}: no KV size per token to judge the memory by (model config?)")
            continue
        # where the peak could not be reset after the load, the process's: at least the runs'
        peak = mem["run_peak_bytes"] if mem.get("run_peak_bytes") is not None else mem["peak_bytes"]
        grew = peak - mem["rss_after_load_bytes"]
        bound = run["particles"] / 2 * run["prompt_tokens"] * kv
        if grew > bound:
            problems.append(
                f"{name}: RSS grew {grew / 2**20:.0f} MiB over the runs, more than {run['particles'] // 2} "
                f"copies of the prompt's KV ({bound / 2**20:.0f} MiB): the prompt is held per particle"
            )
    return problems
