"""genlm-control programs on genlm-core + genlm-compat vs genlm-backend + genlm-bytes.

The same file, ``control_program.py``, runs unchanged in two environments:

(a) this project's venv: genlm-control 0.4.1 over genlm-core, genlm-hf and genlm-compat;
(b) ``benchmarks/.anchor-venv-control``: genlm-control 0.4.1 over genlm-backend 0.3.1 and
    genlm-bytes 0.2.0 from PyPI (created on first use: CPU torch 2.13.0 first).

Workloads (SmolLM2-135M, float32, CPU, fixed seed): ``regex`` - PromptedLLM + BoolFSA
through AWRS, SMC with 10 particles and 30 tokens; ``bytes`` - the ByteLLM potential
(K=5) scoring a sentence byte by byte. Each is run ``--repeats`` times per stack in a
fresh process; the median wall time (model load excluded) is reported, and the wall
time during which the program waits on the language model (``LM wait``: at least one
next-token call in flight), which separates the backend's share from the client's own
work (AWRS's constraint checks, the SMC loop). Each program then runs again in the same
process with the same seeds while every next-token row is in the backend's output cache
(``rows cached``): the program's own work with a near-free language model. ``(b)`` divided
by (a)'s rows-cached time bounds the ratio any backend could reach on the workload.
Target: (a) at least 3x faster than (b). Run it on a quiet machine.

    .venv/bin/python benchmarks/bench_control.py [--repeats 3] [--workloads regex,bytes]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import ensure_venv, write_results  # noqa: E402

ANCHOR_VENV = HERE / ".anchor-venv-control"
TORCH = "torch==2.13.0"
ANCHOR_PINS = [
    "genlm-backend==0.3.1",
    "genlm-bytes==0.2.0",
    "genlm-control==0.4.1",
    "genlm-grammar==0.2.0",
    "transformers>=5.16.1,<5.20",
]
PROGRAM = HERE / "control_program.py"


def run_program(python: str, model: str, workload: str, seed: int, threads: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [python, str(PROGRAM), model, workload, "--seed", str(seed)], env=env, capture_output=True, text=True
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{python} {workload} failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--workloads", default="regex,bytes")
    args = ap.parse_args()
    if args.model is None:
        from genlm_core import models

        args.model = str(models.smollm2_path())
    stacks = {
        "genlm-core": sys.executable,
        "genlm-backend": str(
            ensure_venv(ANCHOR_VENV, TORCH, ANCHOR_PINS, "import genlm.control, genlm.bytes")
        ),
    }
    rows, raw = [], {}
    for workload in args.workloads.split(","):
        walls: dict[str, list[float]] = {}
        waits: dict[str, list[float]] = {}
        reruns: dict[str, list[float]] = {}
        for name, py in stacks.items():
            runs = [
                run_program(py, args.model, workload, args.seed, args.threads) for _ in range(args.repeats)
            ]
            raw[f"{workload}/{name}"] = runs
            walls[name] = [r["wall_s"] for r in runs]
            waits[name] = [r["lm_wait_s"] for r in runs]
            reruns[name] = [r["cached_rerun_s"] for r in runs]
            print(f"[bench_control] {workload} {name}: {[round(w, 2) for w in walls[name]]} s", flush=True)
        a, b = statistics.median(walls["genlm-core"]), statistics.median(walls["genlm-backend"])
        wa, wb = statistics.median(waits["genlm-core"]), statistics.median(waits["genlm-backend"])
        ra, rb = statistics.median(reruns["genlm-core"]), statistics.median(reruns["genlm-backend"])
        rows.append(
            {
                "workload": workload,
                "(a) genlm-core s": round(a, 3),
                "(b) genlm-backend s": round(b, 3),
                "(b)/(a)": round(b / a, 2),
                "(a) LM wait s": round(wa, 3),
                "(b) LM wait s": round(wb, 3),
                "LM wait (b)/(a)": round(wb / wa, 2),
                "(a) rows cached s": round(ra, 3),
                "(b) rows cached s": round(rb, 3),
                "bound (b)/(a rows cached)": round(b / ra, 2),
                "target": ">= 3x" if workload == "regex" else "report",
            }
        )
    write_results("control", rows, {"args": vars(args), "runs": raw})


if __name__ == "__main__":
    main()
