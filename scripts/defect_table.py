#!/usr/bin/env python
"""The defect catalogue on real engines (genlm_core.testing.defects): the figures of
docs/numerics.md, and the GPU check's proof that every gate fails on every defect there.

``--mode measure`` (the default) runs every gate to its end on every defect with no
comparison failing (``defects.measure``): the largest ``measured / bound`` each statistic
reached; the same gates on the correct engine give the other side (how far under its
bounds a correct path stays). For each engine, dtype and defect the table shows the
weakest gate's figure (what every gate clears) and its statistic (t: the tail, the
largest difference of an entry; s: the rows' common logit scale). ``--mode catch`` runs
each gate until it fails (``defects.catch``, what the ``defects`` tests do): faster, and
its figure is the first comparison past its bound. The exit status is 1 when a gate did
not fail on a defect or, measuring, a correct path came within 4x of a bound (the test
command's headroom).

``--discrimination MODEL`` instead measures, on that model folder in ``--dtypes``, how far
rows of contexts that differ in one token are apart against the bound
(``defects.discrimination``): exit 1 when a median figure is at most
``--min-discrimination`` (1).

Usage::

    python scripts/defect_table.py --engines hf llamacpp vllm --out build/defect-table.jsonl
    python scripts/defect_table.py --report build/defect-table.jsonl      # the Markdown only
    python scripts/defect_table.py --engines hf --device cuda --mode catch  # the GPU check
    python scripts/defect_table.py --discrimination DIR --dtypes bfloat16 --device cuda

On the CPU it runs with one intra-op thread (a busy 2-core machine runs it faster so; the
figures do not depend on it beyond rounding).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HF_PATHS = {
    "eager": {"static_decode": "off"},
    "static": {"static_decode": "on", "fused_decode": False},
    "fused": {"static_decode": "on"},
}
ENGINES = ("hf", "llamacpp", "vllm")
DTYPES = ("float32", "bfloat16", "float16")


def backends(engine: str, dtype: str, device: str, paths: list[str]) -> list[tuple[str, Any]]:
    """``(label, loader)`` of the backends of ``engine`` in ``dtype`` (loaders: one backend
    lives at a time)."""
    import genlm_core
    from genlm_core.testing import models

    tiny = str(models.tiny_llama())
    if engine == "hf":
        return [
            (f"hf {name}", lambda o=opts: genlm_core.load("hf", model=tiny, dtype=dtype, device=device, **o))
            for name, opts in HF_PATHS.items()
            if not paths or name in paths
        ]
    if engine == "llamacpp":
        gguf = Path.home() / ".cache/genlm-core/models/tiny-llama-f32.gguf"
        return [("llama.cpp", lambda: genlm_core.load("llamacpp", model=str(gguf), dtype=dtype, n_threads=1))]
    opts = dict(enforce_eager=True, max_model_len=256, max_num_batched_tokens=32, batch_size=16)
    return [
        (
            "vllm",
            lambda: genlm_core.load("vllm", model=tiny, dtype=dtype, engine_opts={"block_size": 32}, **opts),
        )
    ]


def one(llm: Any, defect: Any, gate: Any, settings: Any, mode: str) -> dict[str, Any]:
    """One gate on one defect (None: the correct engine): its figures."""
    from genlm_core.testing.gates import catch, measure

    if mode == "measure" or defect is None:
        m = measure(llm, defect, gate, settings)
        return {
            "tail": m.tail,
            "scale": m.scale,
            "spread": m.spread,
            "comparisons": m.comparisons,
            "stopped": m.stopped,
        }
    try:
        c = catch(llm, defect, gate, settings)
    except AssertionError as exc:  # the gate passed: it cannot see the defect
        return {"tail": 0.0, "scale": 0.0, "missed": str(exc).splitlines()[0]}
    ratio = c.ratio if c.ratio is not None else float("inf")
    scale = c.statistic == "logit scale"
    return {"tail": 0.0 if scale else ratio, "scale": ratio if scale else 0.0}


def run(args: argparse.Namespace) -> None:
    import torch

    from genlm_core.testing.defects import CATALOGUE
    from genlm_core.testing.gates import gate_settings, gates_for

    if args.device == "cpu":
        torch.set_num_threads(1)
    with args.out.open("a") as f:
        for engine in args.engines:
            for dtype in args.dtypes or DTYPES:
                for label, load in backends(engine, dtype, args.device, args.paths):
                    llm = load()
                    try:
                        settings = gate_settings(llm)
                        for defect in [None, *(d for d in CATALOGUE if not d.needs_adapter)]:
                            for gate in gates_for(llm, defect or CATALOGUE[0]):
                                t0 = time.perf_counter()
                                rec = {
                                    "engine": label,
                                    "dtype": dtype,
                                    "device": args.device,
                                    "mode": args.mode,
                                    "defect": defect.name if defect is not None else "none",
                                    "gate": gate.name,
                                    **one(llm, defect, gate, settings, args.mode),
                                    "seconds": round(time.perf_counter() - t0, 2),
                                }
                                f.write(json.dumps(rec) + "\n")
                                f.flush()
                                missed = " MISSED" if "missed" in rec else ""
                                print(
                                    f"{label} {dtype} {rec['defect']}: {gate.name} "
                                    f"tail {rec['tail']:.3g} scale {rec['scale']:.3g}{missed}",
                                    file=sys.stderr,
                                )
                    finally:
                        llm.close()


def report(path: Path) -> str:
    """The Markdown table of a run's records."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in recs:
        by[(r["engine"], r["dtype"], r["defect"])].append(r)
    defects = list(dict.fromkeys(r["defect"] for r in recs if r["defect"] != "none"))
    columns = list(dict.fromkeys((r["engine"], r["dtype"]) for r in recs))

    def cell(rs: list[dict], pick: Any) -> str:
        if not rs:
            return "-"
        r = pick(rs, key=lambda r: max(r["tail"], r["scale"]))
        return f"{max(r['tail'], r['scale']):.3g} {'s' if r['scale'] > r['tail'] else 't'}"

    short = {d: d.replace(" (40+ tokens)", " 40+").replace("a neighbouring row of the batch", "neighbour row")
             .replace("the row of the step before", "step before's row").replace("position +1 on a resumed row", "position +1")
             for d in defects}  # fmt: skip
    lines = [
        "| engine | dtype | " + " | ".join(short[d] for d in defects) + " | correct (largest) |",
        "|---|---|" + "---:|" * (len(defects) + 1),
    ]
    for e, d in columns:
        cells = [cell(by[(e, d, defect)], min) for defect in defects] + [cell(by[(e, d, "none")], max)]
        lines.append(f"| {e} | {d} | " + " | ".join(cells) + " |")
    caught = all(r.get("mode") == "catch" for r in recs if r["defect"] != "none")
    what = (
        "each gate run until it failed: the weakest gate's first comparison past its bound"
        if caught
        else "each gate run to its end: the weakest gate's largest measured / bound"
    )
    return f"Defect catalogue, {what} (t: tail, s: logit scale):\n\n" + "\n".join(lines)


def failures(path: Path) -> list[str]:
    """What makes a run fail: a gate that did not fail on a defect, a correct path within
    4x of a bound."""
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        ratio = max(r["tail"], r["scale"])
        where = f"{r['engine']} {r['dtype']}: {r['gate']}"
        if r["defect"] == "none" and ratio > 0.25:
            out.append(f"{where}: a correct path at {ratio:.3g} of its bound (more than a quarter)")
        elif r["defect"] != "none" and not ratio > 1:
            why = r.get("missed") or f"largest ratio {ratio:.3g}"
            out.append(f"{where} does not fail on {r['defect']} ({why})")
    return out


def discriminate(model: str, dtypes: list[str], device: str, minimum: float) -> tuple[str, list[str]]:
    """The discrimination figures of ``model`` in each dtype (Markdown) and the failures."""
    import torch

    import genlm_core
    from genlm_core.testing.gates import discrimination

    if device == "cpu":
        torch.set_num_threads(1)
    head = [f"L{n}-{w}" for n in (16, 40) for w in ("last", "middle", "first")]
    lines = ["| model | dtype | " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(head)]
    bad = []
    for dtype in dtypes:
        llm = genlm_core.load("hf", model=model, dtype=dtype, device=device)
        try:
            fig = discrimination(llm)
        finally:
            llm.close()
        name = Path(model).name
        lines.append(f"| {name} | {dtype} | " + " | ".join(f"{fig[h]:.3g}" for h in head) + " |")
        bad += [f"{name} {dtype} {h}: {fig[h]:.3g} <= {minimum:g}" for h in head if not fig[h] > minimum]
    return "\n".join(lines), bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", nargs="*", default=["hf"], choices=ENGINES)
    ap.add_argument(
        "--paths", nargs="*", default=[], choices=list(HF_PATHS), help="genlm-hf's paths (default all)"
    )
    ap.add_argument("--dtypes", nargs="*", default=[], choices=DTYPES, help="default: all")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", default="measure", choices=["measure", "catch"])
    ap.add_argument("--out", type=Path, default=Path("build/defect-table.jsonl"))
    ap.add_argument("--md", type=Path, default=None, help="also write the Markdown here")
    ap.add_argument("--report", type=Path, default=None, help="the table of an earlier run only")
    ap.add_argument("--discrimination", default=None, metavar="MODEL", help="a model folder's discrimination")
    ap.add_argument("--min-discrimination", type=float, default=1.0)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.discrimination is not None:
        table, bad = discriminate(
            args.discrimination, args.dtypes or ["float32"], args.device, args.min_discrimination
        )
        text = "Rows of contexts that differ in one token, against the bound (median of 8):\n\n" + table
    else:
        if args.report is None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.unlink(missing_ok=True)
            run(args)
        path = args.report or args.out
        text, bad = report(path), failures(path)
    if bad:
        text += "\n\nFailed:\n" + "\n".join(f"- {b}" for b in bad)
    print(text)
    if args.md is not None:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
