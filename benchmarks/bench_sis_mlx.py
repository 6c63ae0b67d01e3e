"""The SIS workload of ``bench_sis.py`` on genlm-mlx and genlm-hf in the same run.

Runs ``bench_sis.run_genlm_core`` (16 particles, "Montreal is", 20 tokens, fixed
seed, SmolLM2-135M float32 on the CPU) for ``hf`` and then ``mlx`` in one process,
and reports calls/s and the mlx / hf ratio.

The ``mlx[cpu]`` Linux wheel links the reference (netlib) BLAS, whose float32 GEMM
runs ~15x slower than OpenBLAS here. ``--blas PATH`` adds a third figure: mlx in a
subprocess with ``LD_PRELOAD=PATH`` (an OpenBLAS exporting ``cblas_sgemm``), which
replaces the GEMM without changing anything else.

Usage::

    .venv/bin/python benchmarks/bench_sis_mlx.py
    .venv/bin/python benchmarks/bench_sis_mlx.py --blas /path/to/libopenblas.so
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_sis  # noqa: E402
from common import OUT_DIR  # noqa: E402


def figure(backend: str, argv: list[str]) -> dict[str, Any]:
    args = bench_sis.parse_args(["--backend", backend, "--no-anchor", "--no-uncached", *argv])
    if args.model is None:
        args.model = bench_sis.default_model(backend)
    res = bench_sis.run_genlm_core(args)
    return {k: v for k, v in res.items() if k not in ("contexts", "prompt_ids", "walls")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blas", default=None, help="OpenBLAS library to LD_PRELOAD for a third (mlx) figure")
    p.add_argument("--only", default=None, help=argparse.SUPPRESS)  # subprocess: one backend, JSON out
    p.add_argument("--repeats", default="1")
    p.add_argument("--out", type=Path, default=OUT_DIR / "sis_mlx.json")
    args = p.parse_args()
    common = ["--repeats", args.repeats]
    if args.only:
        print(json.dumps(figure(args.only, common)))
        return
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    figures = {"hf": figure("hf", common), "mlx": figure("mlx", common)}
    if args.blas:
        env = {**os.environ, "LD_PRELOAD": args.blas}
        cmd = [sys.executable, __file__, "--only", "mlx", "--repeats", args.repeats]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        figures["mlx+openblas"] = json.loads(out.strip().splitlines()[-1])
    hf = figures["hf"]["calls_per_s"]
    record = {
        "workload": {"prompt": bench_sis.PROMPT, "particles": 16, "max_tokens": 20, "seed": 0},
        "load_avg_1m": os.getloadavg()[0],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "figures": figures,
        "ratio_vs_hf": {k: v["calls_per_s"] / hf for k, v in figures.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print("| backend | calls | wall (s) | calls/s | tokens computed | vs hf |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, fig in figures.items():
        print(
            f"| {name} | {fig['calls']} | {fig['wall_s']:.2f} | {fig['calls_per_s']:.2f} | "
            f"{fig.get('tokens_computed_per_run', 0)} | {fig['calls_per_s'] / hf:.3f}x |"
        )


if __name__ == "__main__":
    main()
