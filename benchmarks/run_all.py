"""Run the benchmark suite (what ``genlm bench`` calls), summarise it and plot it.

Each benchmark runs in a subprocess of its own (vLLM and the numba trie kernels
must not share a process; each engine gets a clean thread pool) and writes its
JSON + Markdown into ``benchmarks/out/``. This script then writes
``summary.json`` and ``summary.md`` (headline figures with their targets and the
anchors measured in the same run) and, with ``--plot``, one PNG figure (plots.py).
It only orchestrates: each benchmark judges its own JSON against its own targets
(``headline(result)`` in its ``bench_*.py``, rows built with ``verdicts.row``).

Sections (``--only`` picks some): the workloads of ``workloads.py``, in its order (the
summary table's); ``--help`` lists them with what each measures, and benchmarks/README.md
says how to add one.

Anchors (genlm-backend 0.3.1, genlm-bytes 0.2.0) are installed from PyPI into
``benchmarks/.anchor-venv*`` the first time (a few minutes). ``--quick`` skips the
anchors and shortens every workload (a smoke run, not figures to report). ``--smoke``
(what CI runs) is ``--quick`` on every section, with every backend required, and then
each benchmark's ``smoke(result)`` checks: deterministic counters (forward passes per
SIS run, tokens computed against the tokens that are new, contexts per forward pass)
that show a path was lost. It fails on any exception or failed check, never on a timing.

Run on a quiet machine: another job on the other core made figures 5x wrong here.

Usage::

    .venv/bin/python benchmarks/run_all.py --plot benchmarks/out/bench.png
    .venv/bin/python benchmarks/run_all.py --only trie bytes
    .venv/bin/python benchmarks/run_all.py --quick --plot /tmp/smoke.png
    .venv/bin/python benchmarks/run_all.py --smoke --out-dir build/bench-smoke
    .venv/bin/python benchmarks/run_all.py --out-dir benchmarks/results --plot benchmarks/results/bench.png
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import OUT_DIR, machine, markdown_table  # noqa: E402
from verdicts import COLUMNS, load  # noqa: E402
from workloads import BY_NAME, WORKLOADS, sections_help  # noqa: E402


def _sections(quick: bool) -> dict[str, list[str]]:
    """Each section's command (its script and arguments), in the summary's order."""
    return {w.name: w.argv(quick) for w in WORKLOADS}


# which backend plugin a section needs (skipped, with the reason, when it is not available)
NEEDS = {w.name: w.needs for w in WORKLOADS if w.needs}
# the JSON files each section writes into benchmarks/out; its verdict reads the first
FILES = {w.name: list(w.files) for w in WORKLOADS}
# keyword arguments of a section's verdict: bench_sis judges one backend's record of sis.json
VERDICT_ARGS = {w.name: w.verdict_args for w in WORKLOADS if w.verdict_args}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def backend_status() -> dict[str, str]:
    import genlm_core

    out = {}
    for info in genlm_core.list_backends():
        out[info["name"]] = (
            info["status"] if info["status"] == "available" else f"{info['status']}: {info['reason']}"
        )
    return out


def run_section(name: str, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = [sys.executable, str(HERE / argv[0]), *argv[1:]]
    log(f"{name}: {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, env=env, cwd=HERE.parent)
    dt = time.perf_counter() - t0
    log(f"{name}: exit {rc} after {dt:.0f} s")
    return {"command": " ".join(["python", *[str(Path(argv[0]).name), *argv[1:]]]), "rc": rc, "seconds": dt}


# ---------------------------------------------------------------------- verdicts
def verdict(section: str) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """The ``headline`` of the benchmark script a section runs (importing one loads no engine)."""
    module = importlib.import_module(Path(BY_NAME[section].script).stem)
    return functools.partial(module.headline, **VERDICT_ARGS.get(section, {}))


def smoke_problems(sections: list[str], out_dir: Path) -> dict[str, list[str]]:
    """Each section's ``smoke(result)`` on the JSON it wrote (sections whose benchmark
    has no counters to check map to an empty list); a missing JSON is a problem."""
    found: dict[str, list[str]] = {}
    for name in sections:
        module = importlib.import_module(Path(BY_NAME[name].script).stem)
        result = load(FILES[name][0], out_dir)
        if not result:
            found[name] = [f"{name}: wrote no {FILES[name][0]}.json"]
        elif hasattr(module, "smoke"):
            found[name] = module.smoke(result, **VERDICT_ARGS.get(name, {}))
        else:
            found[name] = []
    return found


def headline(sections: list[str], out_dir: Path | None = None) -> list[dict[str, Any]]:
    """The chosen sections' verdicts on the JSON they wrote into ``out_dir``, in table order."""
    out_dir = OUT_DIR if out_dir is None else out_dir
    rows: list[dict[str, Any]] = []
    for name in _sections(False):
        if name in sections and (result := load(FILES[name][0], out_dir)):
            rows += verdict(name)(result)
    return rows


def write_summary(report: dict[str, Any], sections: list[str], out_dir: Path) -> list[str]:
    """``summary.json`` (``report`` with the headline rows) and ``summary.md`` (those rows,
    the section runs, then each section's own Markdown) into ``out_dir``; the Markdown lines."""
    rows = headline(sections, out_dir)
    report["headline"] = rows
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(report, indent=2))
    md = [
        "# genlm-core benchmark summary",
        "",
        f"Machine: {report['machine']}",
        "",
        markdown_table(rows, COLUMNS),
        "",
        "Sections: "
        + ", ".join(
            f"{k} ({v['seconds']:.0f} s, exit {v['rc']})" if "rc" in v else f"{k} ({v['skipped']})"
            for k, v in report["sections"].items()
        ),
        "",
    ]
    for name in dict.fromkeys(f for s in sections for f in FILES[s]):
        p = out_dir / f"{name}.md"
        if p.exists():
            md += [p.read_text(), ""]
    (out_dir / "summary.md").write_text("\n".join(md))
    return md


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    all_sections = list(_sections(False))
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=sections_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--only", nargs="+", choices=all_sections, default=None, help="sections to run")
    ap.add_argument("--quick", action="store_true", help="smoke run: no anchors, short workloads")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="--quick on every section, every backend required, then the counter checks (CI)",
    )
    ap.add_argument("--plot", type=Path, default=None, help="write a PNG figure (needs matplotlib)")
    ap.add_argument(
        "--out-dir", type=Path, default=None, help="also copy results here (e.g. benchmarks/results)"
    )
    ap.add_argument("--no-run", action="store_true", help="only summarise/plot what benchmarks/out holds")
    args = ap.parse_args(argv)
    args.quick = args.quick or args.smoke

    chosen = args.only or all_sections
    specs = _sections(args.quick)
    status = backend_status()
    load = os.getloadavg()[0]
    if load > 0.5 and not args.no_run:
        log(f"warning: 1-minute load average is {load:.2f}; figures from a busy machine are not comparable")
    report: dict[str, Any] = {"machine": machine(), "quick": args.quick, "backends": status, "sections": {}}
    previous = OUT_DIR / "summary.json"
    if args.no_run and previous.exists():  # re-summarising: keep the run's own machine and timings
        prev = json.loads(previous.read_text())
        report.update({k: prev[k] for k in ("machine", "quick", "sections") if k in prev})
        report["resummarised"] = machine()["date"]
    if not args.no_run:
        if "sis" in chosen and (OUT_DIR / "sis.json").exists():
            (OUT_DIR / "sis.json").unlink()  # sis.json merges per backend: a full run starts clean
        if args.smoke:  # judge only what this run writes
            for name in chosen:
                for f in FILES[name]:
                    (OUT_DIR / f"{f}.json").unlink(missing_ok=True)
        for name in chosen:
            need = NEEDS.get(name)
            if need and status.get(need) != "available" and not args.smoke:
                report["sections"][name] = {
                    "skipped": f"backend {need!r} is {status.get(need, 'not registered')}"
                }
                log(f"{name}: skipped ({report['sections'][name]['skipped']})")
                continue
            report["sections"][name] = run_section(name, specs[name])
    md = write_summary(report, chosen, OUT_DIR)
    print("\n".join(md[:6]))
    if args.plot:
        from plots import plot

        plot(args.plot, OUT_DIR)
        log(f"plot: {args.plot}")
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for s in chosen:
            for f in FILES[s]:
                for ext in ("json", "md"):
                    p = OUT_DIR / f"{f}.{ext}"
                    if p.exists():
                        shutil.copy2(p, args.out_dir / p.name)
        for f in ("summary.json", "summary.md"):
            shutil.copy2(OUT_DIR / f, args.out_dir / f)
        log(f"results copied to {args.out_dir}")
    failed = [k for k, v in report["sections"].items() if v.get("rc")]
    if failed:
        log(f"failed sections: {', '.join(failed)}")
    if args.smoke:
        problems = smoke_problems(chosen, OUT_DIR)
        for name, found in problems.items():
            log(f"smoke {name}: {'; '.join(found) if found else 'counters as expected'}")
        if any(problems.values()):
            return 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
