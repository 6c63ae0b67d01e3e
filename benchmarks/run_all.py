"""Run the benchmark suite (what ``genlm bench`` calls), summarise it and plot it.

Each benchmark runs in a subprocess of its own (vLLM and the numba trie kernels
must not share a process; each engine gets a clean thread pool) and writes its
JSON + Markdown into ``benchmarks/out/``. This script then writes
``summary.json`` and ``summary.md`` (headline figures with their targets and the
anchors measured in the same run) and, with ``--plot``, one PNG figure (plots.py).
It only orchestrates: each benchmark judges its own JSON against its own targets
(``headline(result)`` in its ``bench_*.py``, rows built with ``verdicts.row``).

Sections (``--only`` picks some):

  batcher   AutoBatcher overhead per request and the timer policy under SMC load
  gather    genlm serve's gatherer in front of an engine timed like the H100's and this
            CPU's passes: holding for every missing client vs only those due in time
  vocab     byte-vocabulary decoding of real tokenizers (Qwen 151k, GPT-2, ...)
  trie      trie mass sums, Qwen 151k and GPT-2, vs genlm-backend / genlm-bytes
  sis       autobatched SIS on genlm-hf vs genlm-backend and an uncached loop,
            plus throughput against particle count
  sis-mlx   the same workload on genlm-mlx (throughput against particles)
  sis-vllm  the same workload on genlm-vllm (throughput against particles)
  vllm      genlm-vllm's logprob capture vs raw ``generate`` and the logprobs dict
  bytes     byte-level beam (K=5, K=1) vs genlm-bytes over genlm-backend
  llamacpp  genlm-llamacpp (SmolLM2 Q4_1 and f16 GGUFs) vs genlm-hf float32 on SIS and
            the byte beam K=5, and our layer vs raw llama.cpp replaying the same batches
  serve     four SIS client processes: a backend each vs one `genlm serve hf` (shared
            memory, network frame): calls/s, per-call latency, total RSS, where a step goes
  hf-step   the hf backend's SIS-like step vs the raw transformers forward, 16 and 64 rows
  hf-step-grow  the same with every row's context growing a token a call, as SIS's
            (``bench_hf_step.py --grow``: the path of genlm-hf's decode step)
  burst     the SIS program as per-step calls vs one burst (hf f32, llama.cpp f16)
  long-prompt  a 907- and a 4,096-token prompt shared by 32-256 particles (SIS, SMC with
            resampling) on hf, llama.cpp, vLLM, MLX and genlm-backend (time-capped): calls/s,
            tokens computed against the minimum, peak RSS, time outside the engine
            (``--smoke``: 907 x 32 x 3 SIS and 907 x 32 x 8 SMC on hf and llama.cpp, counters only)

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

SIS_PARTICLES = 16


def _sections(quick: bool) -> dict[str, list[str]]:
    q = quick
    sis_short = ["--max-tokens", "8"] if q else []
    return {
        "batcher": ["bench_batcher.py", *(["--quick"] if q else [])],
        "gather": ["bench_gather.py", *(["--quick"] if q else [])],
        "vocab": ["bench_vocab.py", *(["--quick"] if q else [])],
        "trie": ["bench_trie.py", *(["--no-anchors", "--repeat", "10"] if q else [])],
        "sis": [
            "bench_sis.py",
            "--backend",
            "hf",
            "--particles",
            str(SIS_PARTICLES),
            "--sweep",
            *(["1", "4"] if q else ["1", "4", "32"]),
            *(["--no-anchor", "--no-uncached"] if q else []),
            *sis_short,
        ],
        "sis-mlx": [
            "bench_sis.py",
            "--backend",
            "mlx",
            "--particles",
            str(SIS_PARTICLES),
            "--no-anchor",
            "--no-uncached",
            "--sweep",
            *(["1"] if q else ["1", "4", "32"]),
            *sis_short,
        ],
        "sis-vllm": [
            "bench_sis.py",
            "--backend",
            "vllm",
            "--particles",
            str(SIS_PARTICLES),
            "--no-anchor",
            "--no-uncached",
            "--sweep",
            *(["1"] if q else ["1", "4", "32"]),
            *sis_short,
        ],
        "vllm": [
            "bench_vllm.py",
            *(["--batches", "1", "8", "--lengths", "8", "--repeat", "3", "--dict-repeat", "1"] if q else []),
        ],
        "bytes": ["bench_bytes.py", *(["--no-anchor", "--k", "1"] if q else [])],
        "llamacpp": ["bench_llamacpp.py", *(["--quick", "--no-raw"] if q else [])],
        "serve": ["bench_serve.py", *(["--quick"] if q else [])],
        "hf-step": ["bench_hf_step.py", *(["--quick"] if q else [])],
        "hf-step-grow": ["bench_hf_step.py", "--grow", *(["--quick"] if q else [])],
        "burst": ["bench_burst.py", *(["--quick"] if q else [])],
        "long-prompt": ["bench_long_prompt.py", *(["--smoke"] if q else [])],
    }


# which backend plugin a section needs (skipped, with the reason, when it is not available)
NEEDS = {
    "sis": "hf",
    "sis-mlx": "mlx",
    "sis-vllm": "vllm",
    "vllm": "vllm",
    "bytes": "hf",
    "llamacpp": "llamacpp",
    "serve": "hf",
    "hf-step": "hf",
    "hf-step-grow": "hf",
    "burst": "hf",
    "long-prompt": "hf",
}
# the JSON files each section writes into benchmarks/out; its verdict reads the first
FILES = {
    "batcher": ["batcher_overhead", "batcher_policy", "batcher_sequential"],
    "gather": ["gather"],
    "vocab": ["vocab"],
    "trie": ["trie"],
    "sis": ["sis"],
    "sis-mlx": ["sis"],
    "sis-vllm": ["sis"],
    "vllm": ["vllm"],
    "bytes": ["bytes"],
    "llamacpp": ["llamacpp"],
    "serve": ["serve"],
    "hf-step": ["hf_step"],
    "hf-step-grow": ["hf_step_grow"],
    "burst": ["burst"],
    "long-prompt": ["long_prompt"],
}
# keyword arguments of a section's verdict: bench_sis judges one backend's record of sis.json
VERDICT_ARGS = {"sis": {"backend": "hf"}, "sis-mlx": {"backend": "mlx"}, "sis-vllm": {"backend": "vllm"}}


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
    module = importlib.import_module(Path(_sections(False)[section][0]).stem)
    return functools.partial(module.headline, **VERDICT_ARGS.get(section, {}))


def smoke_problems(sections: list[str], out_dir: Path) -> dict[str, list[str]]:
    """Each section's ``smoke(result)`` on the JSON it wrote (sections whose benchmark
    has no counters to check map to an empty list); a missing JSON is a problem."""
    found: dict[str, list[str]] = {}
    for name in sections:
        module = importlib.import_module(Path(_sections(False)[name][0]).stem)
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
