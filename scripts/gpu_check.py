#!/usr/bin/env python
"""The GPU check's steps (scripts/gpu_check.sh runs this; see docs/gpu.md).

On a CUDA machine, within a time budget (default 450 s from the shell script's start):

1. the models: SmolLM2-135M (float32) and SmolLM2-1.7B's shape (bfloat16) built with
   random weights from a real config and tokenizer (scripts/gpu_models.py);
2. the ``cuda`` tests: ``pytest -m cuda`` over the project's suites (collected first:
   a suite that cannot be collected here - an engine not installed - is listed, and the
   ``cuda`` tests that were collected still run; those of :data:`REQUIRED_CUDA_TESTS`,
   the captured static decode step among them, must be collected);
3. the defect catalogue on the device (``scripts/defect_table.py --mode catch``: every
   gate of :mod:`genlm_core.testing.defects` fails on every defect, the tiny Llama on
   genlm-hf's eager, static and fused paths in float32, bfloat16 and float16) and the
   discrimination of the check's models (rows of contexts that differ in one token are
   farther apart than the bound: the random weights are scaled for it, gpu_models.init_std);
4. the GPU benchmarks, short repetitions, in :data:`PLAN`'s order (the runs that give
   the speed targets' figures, scripts/gpu_targets.py, first; the runs of
   :data:`OPTIONAL` only while the budget lasts; every run is declared with its workload
   in benchmarks/workloads.py): ``bench_hf_step
   --grow --graph-account --host-account`` (16 and 64 rows whose contexts grow by a token a call, as
   SIS's: the decode step over the KV pool; its graph's replay against the host's part), ``bench_burst`` (hf, 16 and 64 particles), ``bench_sis`` (SIS, 16
   particles and 64 in its sweep; against genlm-backend 0.3.1 where its reference stack
   is importable, see :func:`anchor`), ``bench_serve`` (four SIS clients, one server;
   GPU memory of every process), the long-prompt shapes: ``bench_hf_step --shared-prompt
   2048`` (64 rows over one 2,048-token prompt, against the 28-token step) and
   ``bench_many_programs`` (8 SIS programs at once, each with its own ~900-token prompt,
   16 particles x 30 tokens, against the same programs one by one). Each benchmark warms up in its timed runs' shape first
   (the captured graphs are then the steady state's, as a program's later runs find them).

Results: ``benchmarks/results/gpu/<device>/`` (``<device>``: the GPU's name, e.g.
``nvidia-h100-80gb-hbm3``): each benchmark's JSON and Markdown as
``<benchmark>-<model>.json|md`` (bench_hf_step's as ``hf_step_grow-<model>``; each names
the device and dtype), the tests' junit XML, ``summary.md`` (the steps, then every table)
and ``check.json`` (the steps, their commands, exit status and seconds). A step that fails or runs out of the budget is
recorded and the next one runs; the exit status is 1 when any did.

``--dry-run-cpu`` runs the same steps on the CPU with the tiny offline model and the
smallest settings (the tests only collected; the defect catalogue and the discrimination
run whole; each benchmark run once, in the order of its first place in the plan), into ``build/gpu-check-dry-run/``: a check of this script, not figures.
It says first whether a GPU was found (``gpu_found`` in ``check.json``, and the summary's
title); without ``--dry-run-cpu`` and with no GPU it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "scripts"))

#: the models of a GPU run: (shape for gpu_models.py, tag in the result names, dtype)
GPU_MODELS = [("1.7b", "smollm2-1.7b-bf16", "bfloat16"), ("135m", "smollm2-135m-f32", "float32")]
DRY_MODELS = [("tiny", "tiny-llama-f32", "float32")]
#: cuda tests the check must collect (a suite that stops collecting them fails the check)
REQUIRED_CUDA_TESTS = [
    # the captured decode step over the KV pool against eager passes, float32 and bfloat16
    # (SIS/SMC shapes: resampling, joins, jumps), and the fused step
    "plugins/genlm_hf/tests/test_hf_step.py::test_steps_captured_on_cuda",
    "plugins/genlm_hf/tests/test_hf_fused.py::test_the_fused_step_equals_the_models_forward",
    # the conformance kit on CUDA: float32 and bfloat16 on the captured step, GPT-2 with a
    # small KV budget, the eager path
    "plugins/genlm_hf/tests/test_hf_cuda_conformance.py::TestHFCudaConformance",
    "plugins/genlm_hf/tests/test_hf_cuda_conformance.py::TestHFCudaGPT2Conformance",
    "plugins/genlm_hf/tests/test_hf_cuda_conformance.py::TestHFCudaEagerConformance",
    # the output cache in host memory: hits back on the GPU
    "plugins/genlm_hf/tests/test_hf_cuda_conformance.py::TestHFCudaHostCacheConformance",
]
from workloads import gpu_plan, gpu_runs  # noqa: E402  (benchmarks/workloads.py: each run declared once)

#: each benchmark run's settings: (on a GPU, in a dry run on the CPU); short repetitions
SIZES = {name: (list(run.gpu), list(run.dry)) for name, (_w, run) in gpu_runs().items()}
#: the benchmark runs of a GPU check, in order (each run's place: its Slots in workloads.py)
PLAN = [(name, model) for name, model, _optional in gpu_plan()]
#: the runs left out when the budget is spent (listed in the summary, not failed)
OPTIONAL = {(name, model) for name, model, optional in gpu_plan() if optional}
#: the results a benchmark writes under SIZES' options, when not its own name
WRITES = {name: w.files[0] for name, (w, _run) in gpu_runs().items() if w.files[0] != name}
#: the benchmark script of a run, when not ``bench_<name>.py``
SCRIPTS = {name: w.stem for name, (w, _run) in gpu_runs().items() if w.stem != name}
#: the most seconds a step may take (and never past the budget)
CAPS = {name: run.cap_s for name, (_w, run) in gpu_runs().items()} | {"defects": 240, "discrimination": 120}


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "unknown"


@dataclass
class Step:
    name: str
    cmd: list[str]
    cap_s: float  # at most this long (and never past the budget)
    optional: bool = False  # left out when the budget is spent, without failing the check
    results: list[tuple[str, str]] = field(default_factory=list)  # (written name, saved as)
    tables: list[str] = field(default_factory=list)  # saved names whose .md goes into summary.md
    rc: int | None = None
    seconds: float = 0.0
    note: str = ""


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.deadline = args.started + args.budget
        self.steps: list[Step] = []
        self.scratch = args.out / ".scratch"  # GENLM_BENCH_OUT: where each benchmark writes
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch.mkdir(parents=True)
        #: whether torch saw a CUDA device (a dry run says so in its summary)
        self.gpu_found = False
        self.env = dict(os.environ)
        self.env.update(
            GENLM_BENCH_OUT=str(self.scratch),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )

    def left(self) -> float:
        return self.deadline - time.time()

    def run(self, step: Step) -> Step:
        self.steps.append(step)
        timeout = min(step.cap_s, self.left())
        if timeout < 5 or (step.optional and timeout < step.cap_s / 2):
            step.note = f"skipped: the budget ({self.args.budget:.0f} s) is spent"
            if step.optional:
                step.rc, step.note = 0, step.note + " (optional)"
            log(f"{step.name}: {step.note}")
            return step
        log(f"{step.name} (at most {timeout:.0f} s): {' '.join(step.cmd)}")
        t0 = time.perf_counter()
        # its own process group: a timeout ends the step's children too (serve's clients, server)
        proc = subprocess.Popen(step.cmd, cwd=ROOT, env=self.env, start_new_session=True)
        try:
            step.rc = proc.wait(timeout=timeout)
        except KeyboardInterrupt:  # its own session: no Ctrl-C reaches it, so end it here
            os.killpg(proc.pid, 9)
            raise
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
            step.rc = 124
            step.note = f"timed out after {timeout:.0f} s"
        step.seconds = time.perf_counter() - t0
        for written, saved in step.results:
            for ext in ("json", "md"):
                src = self.scratch / f"{written}.{ext}"
                if src.exists():
                    shutil.move(src, self.args.out / f"{saved}.{ext}")
        log(f"{step.name}: exit {step.rc} after {step.seconds:.0f} s {step.note}".rstrip())
        return step


def anchor(py: str, env: dict[str, str]) -> tuple[str | None, str | None, str]:
    """The interpreter and PYTHONPATH for bench_sis's genlm-backend 0.3.1 reference, or
    ``(None, None, why not)``. ``$GENLM_ANCHOR_PYTHON`` (default: this interpreter) with
    ``$GENLM_ANCHOR_PYTHONPATH`` (gpu_check.sh sets it to a bundle's anchor wheels);
    importable means: the distribution genlm-backend is 0.3.1 (``importlib.metadata``),
    ``genlm.backend`` is its own files (not genlm-compat's names) and
    ``genlm.backend.llm.AsyncTransformer`` imports."""
    anchor_py = os.environ.get("GENLM_ANCHOR_PYTHON") or py
    path = os.environ.get("GENLM_ANCHOR_PYTHONPATH") or None
    probe = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r}); from bench_sis import check_anchor; check_anchor(); "
        "from genlm.backend.llm import AsyncTransformer"
    )
    sub = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    if path:
        sub["PYTHONPATH"] = path
    try:
        proc = subprocess.run([anchor_py, "-c", probe], env=sub, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, None, f"{anchor_py}: {e}"
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return None, None, lines[-1] if lines else f"exit {proc.returncode}"
    return anchor_py, path, ""


def collect_cuda_tests(check: Check, py: str) -> tuple[list[str], list[str], str]:
    """Node ids of the ``cuda`` tests, the suites that could not be collected, pytest's tail."""
    cmd = [py, "-m", "pytest", "--collect-only", "-q", "-m", "cuda", "-p", "no:cacheprovider"]
    log(f"collecting the cuda tests: {' '.join(cmd[1:])}")
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=check.env, capture_output=True, text=True, timeout=max(10, check.left())
        )
    except subprocess.TimeoutExpired:
        return [], [], "collecting the tests ran out of the budget"
    out = proc.stdout + proc.stderr
    ids = [
        ln.strip() for ln in proc.stdout.splitlines() if "::" in ln and not ln.startswith(("ERROR", "FAILED"))
    ]
    errors = sorted(set(re.findall(r"ERROR collecting (\S+)", out)))
    return ids, errors, "\n".join(out.strip().splitlines()[-5:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dry-run-cpu", action="store_true", help="the same steps on the CPU, tiny model, smallest settings"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="results folder (default: benchmarks/results/gpu/<device>)"
    )
    ap.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="where the built models go (default: /tmp/genlm-gpu-models)",
    )
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for the whole check (default 450)")
    ap.add_argument("--started", type=float, default=None, help=argparse.SUPPRESS)  # the shell script's start
    ap.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["tests", "defects", *SIZES],
        help="steps left out: the tests, the defect catalogue, or a benchmark run by its name (hf_step, ...)",
    )
    args = ap.parse_args(argv)
    args.started = args.started or time.time()
    py = sys.executable
    dry = args.dry_run_cpu
    import torch

    gpu_found = torch.cuda.is_available()
    if not dry and not gpu_found:
        print(
            f"gpu_check: no GPU found (no CUDA device; torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}): run it on a machine with an NVIDIA GPU, or pass --dry-run-cpu to "
            "check the script on the CPU",
            file=sys.stderr,
        )
        return 2
    if dry:
        log(
            (
                f"no GPU found (no CUDA device; torch {torch.__version__}): "
                if not gpu_found
                else f"a GPU is here ({torch.cuda.get_device_name()}) but --dry-run-cpu was asked: "
            )
            + "a dry run on the CPU, every step at tiny size (the long-prompt step and the many "
            "programs included): a check of the script, no figures"
        )
    from common import device_info

    device = "cpu" if dry else "cuda"
    info = device_info(device)
    dev_slug = slug(info["device_name"])
    if args.out is None:
        args.out = ROOT / ("build/gpu-check-dry-run" if dry else "benchmarks/results/gpu") / dev_slug
    args.out.mkdir(parents=True, exist_ok=True)
    models_dir = args.models_dir or (ROOT / "build/gpu-models" if dry else Path("/tmp/genlm-gpu-models"))
    log(
        f"{info['device_name']} ({device}), torch {info['torch']}, budget {args.budget:.0f} s; results: {args.out}"
    )
    check = Check(args)
    check.gpu_found = gpu_found
    models = DRY_MODELS if dry else GPU_MODELS
    names = [*SIZES, *WRITES.values()]  # (hf_step-<tag>: an earlier run's, before --grow)
    stale = [f"{name}-{tag}.{ext}" for name in names for _, tag, _ in models for ext in ("json", "md")]
    stale += [f"discrimination-{tag}.md" for _, tag, _ in models] + ["defects-tiny.jsonl", "defects-tiny.md"]
    for name in [*stale, "junit-cuda.xml", "summary.md", "check.json"]:  # an earlier run's
        (args.out / name).unlink(missing_ok=True)

    # 1. the models
    step = check.run(
        Step(
            "models",
            [py, "scripts/gpu_models.py", "--out", str(models_dir), "--device", device, "--shapes"]
            + [m[0] for m in models],
            cap_s=120,
        )
    )
    from gpu_models import SHAPES

    built = {}
    for shape, tag, _dtype in models:
        folder = models_dir / SHAPES[shape][0]
        if step.rc == 0 and (folder / "config.json").is_file():
            built[tag] = str(folder)
    if step.rc != 0 or len(built) != len(models):
        log("the models could not be built: no benchmark runs")

    # 2. the cuda tests
    tests: dict[str, Any] = {}
    if "tests" not in args.skip:
        t0 = time.perf_counter()
        ids, errors, tail = collect_cuda_tests(check, py)
        tests = {"collected": ids, "collection_errors": errors}
        if errors:
            log(f"suites not collected here (their engine is missing?): {', '.join(errors)}")
        missing = [t for t in REQUIRED_CUDA_TESTS if not any(i.startswith(t) for i in ids)]
        if missing:
            tests["required_missing"] = missing
            check.steps.append(
                Step(
                    "tests (required)",
                    [],
                    0,
                    rc=1,
                    note=f"required cuda tests not collected: {', '.join(missing)}",
                )
            )
            log(check.steps[-1].note)
        if dry:
            check.steps.append(
                Step("tests (collected only)", [], 0, rc=0 if ids else 1, seconds=time.perf_counter() - t0)
            )
            check.steps[-1].note = (
                f"{len(ids)} cuda tests collected" if ids else f"no cuda test collected: {tail}"
            )
            log(check.steps[-1].note)
        elif not ids:
            check.steps.append(Step("tests", [], 0, rc=1, note=f"no cuda test collected: {tail}"))
        else:
            junit = args.out / "junit-cuda.xml"
            check.run(
                Step(
                    "tests",
                    [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={junit}", *ids],
                    cap_s=150,
                )
            )

    # 3. the defect catalogue on this device: every gate fails on every defect
    # (genlm_core.testing.defects, the tiny Llama on each genlm-hf path and dtype), since a
    # gate that passes a defect on this device's kernels would let wrong rows through
    # unseen; and the check's models give rows that depend on their context (one token
    # changed moves a row past the bound, or no rows check of them could fail)
    if "defects" not in args.skip:
        check.run(
            Step(
                "defects (catalogue)",
                [py, "scripts/defect_table.py", "--engines", "hf", "--device", device, "--mode", "catch",
                 "--out", str(args.out / "defects-tiny.jsonl"), "--md", str(args.out / "defects-tiny.md")],
                cap_s=CAPS["defects"],
                tables=["defects-tiny"],
            )
        )  # fmt: skip
        for _shape, tag, dtype in models:
            if tag in built:
                check.run(
                    Step(
                        f"defects (discrimination) {tag}",
                        [py, "scripts/defect_table.py", "--discrimination", built[tag], "--dtypes", dtype,
                         "--device", device, "--md", str(args.out / f"discrimination-{tag}.md")],
                        cap_s=CAPS["discrimination"],
                        tables=[f"discrimination-{tag}"],
                    )
                )  # fmt: skip

    # 4. the benchmarks
    anchor_py, anchor_path, why = (None, None, "")
    if "sis" not in args.skip:
        anchor_py, anchor_path, why = anchor(py, check.env)
        if anchor_py is None:
            log(
                "SIS against genlm-backend: skipped, its reference stack is not importable here "
                f"({why}). genlm-hf's SIS still runs. For the comparison: an interpreter with "
                "genlm-backend==0.3.1 in $GENLM_ANCHOR_PYTHON (or its site folder in $GENLM_ANCHOR_PYTHONPATH)"
            )
        else:
            log(
                f"SIS against genlm-backend 0.3.1: {anchor_py}"
                + (f" (PYTHONPATH {anchor_path})" if anchor_path else "")
            )
    dtypes = {tag: dtype for _shape, tag, dtype in models}
    plan = [(name, models[0][1]) for name in SIZES] if dry else PLAN
    for name, tag in plan:
        if name in args.skip or tag not in built:
            continue
        dtype = dtypes[tag]
        written = WRITES.get(name, name)
        saved = f"{written if name not in SCRIPTS else name}-{tag}"
        cmd = [
            py,
            f"benchmarks/bench_{SCRIPTS.get(name, name)}.py",
            "--device",
            device,
            "--dtype",
            dtype,
            "--model",
            built[tag],
        ]
        cmd += SIZES[name][1 if dry else 0]
        step = Step(f"{name} {tag}", cmd, cap_s=CAPS[name], tables=[saved], optional=(name, tag) in OPTIONAL)
        if SCRIPTS.get(name, name) == "sis":  # bench_sis writes where it is told (and merges into it)
            ref = []
            if "--no-anchor" not in step.cmd:
                ref = ["--anchor-python", anchor_py] if anchor_py else ["--no-anchor"]
                ref += ["--anchor-pythonpath", anchor_path] if anchor_path else []
            out = args.out / f"{saved}.json"
            out.unlink(missing_ok=True)
            step.cmd += [
                "--backend",
                "hf",
                *ref,
                "--out",
                str(out),
                "--md",
                str(args.out / f"{saved}.md"),
            ]
        else:
            step.results = [(written, saved)]
        check.run(step)
    shutil.rmtree(check.scratch, ignore_errors=True)
    return report(check, info, tests, why if anchor_py is None and "sis" not in args.skip else "")


def report(check: Check, info: dict[str, Any], tests: dict[str, Any], anchor_why: str) -> int:
    """``check.json`` and ``summary.md`` into the results folder; the exit status."""
    from common import device_line, machine, markdown_table
    from gpu_targets import markdown as targets_markdown
    from gpu_targets import targets

    out = check.args.out
    goals = targets(out, check.args.dry_run_cpu)
    failed = [s for s in check.steps if s.rc != 0]
    elapsed = time.time() - check.args.started
    rows = [
        {
            "step": s.name,
            "exit": s.rc if s.rc is not None else "-",
            "seconds": round(s.seconds, 1),
            "note": s.note,
        }
        for s in check.steps
    ]
    payload = {
        "device": info,
        "machine": machine(),
        "dry_run_cpu": check.args.dry_run_cpu,
        "gpu_found": check.gpu_found,
        "budget_s": check.args.budget,
        "elapsed_s": elapsed,
        "steps": [{**r, "command": " ".join(s.cmd)} for r, s in zip(rows, check.steps)],
        "tests": tests,
        "sis_reference": anchor_why or "genlm-backend 0.3.1",
        "targets": goals,
        "ok": not failed,
    }
    (out / "check.json").write_text(json.dumps(payload, indent=2))
    md = [
        f"# GPU check: {info['device_name']}"
        + (
            f" (dry run on the CPU; {'a GPU is here' if check.gpu_found else 'no GPU found'})"
            if check.args.dry_run_cpu
            else ""
        ),
        "",
        device_line(info),
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {elapsed:.0f} s of a {check.args.budget:.0f} s budget"
        + ("" if not failed else f"; failed or skipped: {', '.join(s.name for s in failed)}"),
        "",
        markdown_table(rows, ["step", "exit", "seconds", "note"]),
        "",
        *targets_markdown(goals, check.args.dry_run_cpu),
    ]
    if tests.get("collection_errors"):
        md += [f"Suites not collected here: {', '.join(tests['collection_errors'])}", ""]
    if anchor_why:
        md += [f"SIS against genlm-backend 0.3.1: not run ({anchor_why})", ""]
    for s in check.steps:
        for name in s.tables:
            p = out / f"{name}.md"
            if p.exists():
                text = p.read_text()
                md += [
                    f"## {name}",
                    "",
                    text.split("\n", 1)[1].lstrip("\n") if text.startswith("## ") else text,
                    "",
                ]
    (out / "summary.md").write_text("\n".join(md))
    print("\n".join(md[:8]))
    log(f"done in {elapsed:.0f} s: {out / 'summary.md'}, {out / 'check.json'}")
    if failed:
        log(f"failed or skipped: {', '.join(s.name for s in failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
