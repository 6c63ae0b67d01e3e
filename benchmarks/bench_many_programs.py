"""Many programs, one engine: 8 SIS programs at once, each with its own long prompt.

The shape of an evaluation over a dataset (as genlm-eval runs it; issue 69, item 3):
``--programs`` programs (8), each the README's SIS (``sis_workload.sis``) with its own
prompt of ``--prompt-tokens`` tokens (about 900: windows of the GNU GPL v3 of
``prompts/``, each starting elsewhere in the text, so no two share a prefix), ``--particles``
particles (16) and ``--tokens`` tokens (30), against one genlm-hf backend through the
public API. This is the GPU check's run of that shape (``many_programs`` in
``benchmarks/workloads.py``; ``--device cuda``); ``bench_long_prompt.py`` is where every
engine is to run it (branch house-many): when it does, point the GPU run there.

Three phases on one loaded backend, each from cleared caches:

  warm-up     the programs together, then one alone, other seeds (every batch shape the
              timed runs meet: a GPU's decode graphs are captured before the timing);
  one by one  each program alone, one after another: its calls/s, and the sum's;
  together    every program at once (``asyncio.gather``): calls/s over all of them, each
              program's own calls/s (the slowest against the mean: none starves).

Figures (``figures`` in the JSON): ``together_over_sequential`` (calls/s together over
the sum one by one; target >= 0.9), ``memory_together_over_alone`` (peak device memory
together over the largest alone, CUDA only; target <= 1.5), ``slowest_over_mean``, and the
tokens computed against the minimum of each phase (``prefix_tree.PrefixTree`` over the
calls: each prompt computed once gives ~1.0). On the CPU the figures are the tiny model's
(``--quick``): a check of the code, not figures to report.

Output: ``many_programs.json`` and ``many_programs.md`` in ``$GENLM_BENCH_OUT`` or
``benchmarks/out``.

Usage::

    .venv/bin/python benchmarks/bench_many_programs.py --quick             # tiny model, CPU
    python benchmarks/bench_many_programs.py --device cuda --dtype float32 --model DIR
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import verdicts  # noqa: E402

#: the targets (issue 69, item 3)
TOGETHER_MIN, MEMORY_MAX = 0.9, 1.5
#: the text the prompts are cut from, and how far apart their windows start (characters)
TEXT = HERE / "prompts" / "GPL-3.txt"


def log(msg: str) -> None:
    print(f"[bench_many_programs {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prompts(tokenizer: Any, programs: int, tokens: int) -> list[list[int]]:
    """``programs`` prompts of ``tokens`` tokens each: windows of the text starting at evenly
    spaced characters (a window whose text runs out wraps to the text's start)."""
    text = TEXT.read_text(encoding="utf-8")
    step = max(1, len(text) // programs)
    out = []
    for i in range(programs):
        start = i * step
        window = text[start:] + text[:start]
        ids = [int(t) for t in tokenizer.encode(window[: 12 * tokens], add_special_tokens=False)]
        if len(ids) < tokens:
            raise ValueError(f"prompt {i}: {len(ids)} tokens, fewer than --prompt-tokens {tokens}")
        out.append(ids[:tokens])
    return out


class Peak:
    """Peak device memory over a phase (CUDA's allocator; None elsewhere)."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = device.startswith("cuda") and torch.cuda.is_available()

    def start(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def read(self) -> int | None:
        if not self.cuda:
            return None
        import torch

        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())


async def run_programs(
    llm: Any, prompt_ids: list[list[int]], args: argparse.Namespace, seed: int, tree: Any
) -> list[dict[str, Any]]:
    """Every program in ``prompt_ids`` at once: each one's calls and seconds."""
    from sis_workload import sis

    lengths = [len(t) for t in llm.byte_vocab]
    eos = llm.eos_token_ids[0]

    async def next_logprobs(context: list[int]) -> Any:
        tree.add(context)
        return await llm.next_token_logprobs(context)

    async def one(i: int, prompt: list[int]) -> dict[str, Any]:
        t0 = time.perf_counter()
        res = await sis(
            next_logprobs,
            lengths,
            eos,
            prompt,
            n_particles=args.particles,
            max_tokens=args.tokens,
            seed=seed + i,
        )
        wall = time.perf_counter() - t0
        return {"program": i, "calls": res["calls"], "wall_s": wall, "calls_per_s": res["calls"] / wall}

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompt_ids))))


def phase(
    llm: Any, prompt_ids: list[list[int]], args: argparse.Namespace, seed: int, peak: Peak
) -> dict[str, Any]:
    """One run of ``prompt_ids`` together from cleared caches: its programs, wall time,
    tokens computed against the minimum, peak memory."""
    from prefix_tree import PrefixTree

    llm.clear_cache()
    tree = PrefixTree()
    before = int(llm.stats().get("engine", {}).get("tokens_computed", 0))
    peak.start()
    t0 = time.perf_counter()
    programs = asyncio.run(run_programs(llm, prompt_ids, args, seed, tree))
    wall = time.perf_counter() - t0
    computed = int(llm.stats().get("engine", {}).get("tokens_computed", 0)) - before
    calls = sum(p["calls"] for p in programs)
    return {
        "programs": programs,
        "calls": calls,
        "wall_s": wall,
        "calls_per_s": calls / wall,
        "tokens_computed": computed,
        "minimum_tokens": tree.tokens,
        "peak_bytes": peak.read(),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import genlm_core

    options = {"device": args.device, "dtype": args.dtype, **args.options}
    log(f"loading {args.model} ({options})")
    llm = genlm_core.load("hf", model=str(args.model), **options)
    try:
        prompt_ids = prompts(llm.tokenizer, args.programs, args.prompt_tokens)
        peak = Peak(args.device)
        shape = f"{args.programs} programs x {args.prompt_tokens}-token prompts x {args.particles} particles x {args.tokens} tokens"
        log(f"warm-up: {shape}, together, then one program alone")
        phase(llm, prompt_ids, args, args.seed + 1000, peak)
        phase(llm, prompt_ids[:1], args, args.seed + 2000, peak)
        alone = []
        for i, p in enumerate(prompt_ids):
            alone.append(phase(llm, [p], args, args.seed + i, peak))
            log(f"program {i} alone: {alone[-1]['calls']} calls, {alone[-1]['calls_per_s']:.1f} calls/s")
        together = phase(llm, prompt_ids, args, args.seed, peak)
        log(f"together: {together['calls']} calls, {together['calls_per_s']:.1f} calls/s")
        engine = llm.stats().get("engine", {})
    finally:
        llm.close()
    seq_calls = sum(a["calls"] for a in alone)
    seq_wall = sum(a["wall_s"] for a in alone)
    own = [p["calls_per_s"] for p in together["programs"]]
    peaks = [a["peak_bytes"] for a in alone if a["peak_bytes"] is not None]
    figures = {
        "shape": shape,
        "sequential_calls_per_s": seq_calls / seq_wall,
        "together_calls_per_s": together["calls_per_s"],
        "together_over_sequential": together["calls_per_s"] / (seq_calls / seq_wall),
        "slowest_over_mean": min(own) / statistics.mean(own),
        "together_tokens_over_minimum": together["tokens_computed"] / together["minimum_tokens"],
        "alone_tokens_over_minimum": sum(a["tokens_computed"] for a in alone)
        / sum(a["minimum_tokens"] for a in alone),
        "memory_together_over_alone": together["peak_bytes"] / max(peaks)
        if peaks and together["peak_bytes"]
        else None,
    }
    rows = [
        {
            "program": i,
            "prompt_tokens": len(prompt_ids[i]),
            "alone_calls_per_s": a["calls_per_s"],
            "together_calls_per_s": t["calls_per_s"],
            "alone_x_min": a["tokens_computed"] / a["minimum_tokens"],
            "alone_peak_mb": None if a["peak_bytes"] is None else a["peak_bytes"] / 2**20,
        }
        for i, (a, t) in enumerate(zip(alone, together["programs"]))
    ]
    return {"rows": rows, "figures": figures, "together": together, "engine": engine}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from common import load_options

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--programs", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=900)
    p.add_argument("--particles", type=int, default=16)
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--options", type=load_options, default={}, help="more load() options, as JSON")
    p.add_argument("--quick", action="store_true", help="tiny model, 3 programs x 48 tokens x 3 x 3")
    args = p.parse_args(argv)
    if args.quick:
        args.programs, args.prompt_tokens, args.particles, args.tokens = 3, 48, 3, 3
        if args.model is None:
            sys.path.insert(0, str(HERE.parent / "tests"))
            import model_paths

            args.model = str(model_paths.tiny_llama())
    if args.model is None:
        from genlm_core import models

        args.model = str(models.smollm2_path(progress=True))
    return args


def main(argv: list[str] | None = None) -> int:
    from common import device_info, write_results

    args = parse_args(argv)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            log(f"--device {args.device}: no GPU found (torch {torch.__version__}); pass --device cpu")
            return 2
    result = measure(args)
    write_results(
        "many_programs",
        result["rows"],
        {k: v for k, v in result.items() if k != "rows"} | {"config": {k: v for k, v in vars(args).items()}},
        device=device_info(args.device, args.dtype, args.model),
        title=f"many programs, one engine ({result['figures']['shape']})",
    )
    f = result["figures"]
    log(
        f"together / one by one: {f['together_over_sequential']:.2f}x calls/s (target >= {TOGETHER_MIN}); "
        f"slowest / mean {f['slowest_over_mean']:.2f}; x min {f['together_tokens_over_minimum']:.2f}; "
        f"memory together / alone {f['memory_together_over_alone']}"
    )
    return 0


def headline(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's rows from ``many_programs.json``: calls/s together against one by one,
    and the peak memory (CUDA) together against the largest alone."""
    f = result["figures"]
    rows = [
        verdicts.row(
            f"many programs ({f['shape']}): calls/s together vs one by one",
            f["together_calls_per_s"],
            f["sequential_calls_per_s"],
            f["together_over_sequential"],
            f">= {TOGETHER_MIN}",
            f["together_over_sequential"] >= TOGETHER_MIN,
        )
    ]
    if f.get("memory_together_over_alone") is not None:
        rows.append(
            verdicts.row(
                "many programs: peak device memory, together vs the largest alone",
                ratio=f["memory_together_over_alone"],
                target=f"<= {MEMORY_MAX}",
                met=f["memory_together_over_alone"] <= MEMORY_MAX,
            )
        )
    return rows


def smoke(result: dict[str, Any]) -> list[str]:
    """Counters only (never timings): every program ran, and each prompt was computed once
    (tokens computed at most 1.05x the minimum, together and one by one)."""
    f, problems = result["figures"], []
    for key in ("together_tokens_over_minimum", "alone_tokens_over_minimum"):
        if f[key] > 1.05:
            problems.append(f"many programs: {key} = {f[key]:.2f} > 1.05 (a prompt computed again)")
    if any(p["calls"] == 0 for p in result["together"]["programs"]):
        problems.append("many programs: a program made no call together")
    return problems


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
