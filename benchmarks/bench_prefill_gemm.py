"""genlm-hf's long-prompt prefill against the machine's GEMM rate (issue 69, item 5).

A 4,096-token prompt computed once is almost all matrix products: every token goes
through each layer's seven projections (q, k, v, o, gate, up, down) and, causally, its
attention over the tokens before it. So the fastest a prefill can go on this machine is
its floating-point operations at the rate this machine's BLAS multiplies matrices of
those shapes. This benchmark measures both, in one process, with the same threads:

- **the GEMM rate**: each projection's product at the model's own shapes (read from its
  ``config.json``: ``T x in`` activations times an ``in x out`` weight), float32, best of
  ``--repeats`` after a warm-up, by the faster of MKL's ``torch.nn.functional.linear``
  and oneDNN over a weight packed once (``genlm_hf.cpu_linear.PackedLinear``, what
  genlm-hf's CPU model runs); the rate is the seven projections' FLOPs over their summed
  best times. The attention's
  rate is measured too (``q @ k.T`` and ``p @ v`` per head at the prefill's chunk
  shapes) and reported, not used: the bound counts its FLOPs at the GEMM rate.
- **the prefill**: ``genlm_core.load("hf", model=...)`` (its defaults), one
  ``next_token_logprobs`` over the prompt from clean caches, wall time, best of
  ``--repeats`` (a warm-up over another prompt of the same length first); the engine's
  ``tokens_computed`` must grow by the prompt's length (nothing reused, nothing twice).
- **the bound**: (the projections' FLOPs + the causal attention's FLOPs + the LM head at
  the last position) / the GEMM rate. The ratio prefill / bound is the figure: 1.0 is
  every FLOP at the GEMM rate; the target is <= 1.5.

FLOPs: a projection ``in -> out`` over T tokens is ``2 T in out``; causal attention per
layer ``2 x 2 x H x d x T (T + 1) / 2`` (scores and values, each position over itself
and those before it); the LM head ``2 x hidden x vocab`` for the one position read.

Output: ``prefill_gemm.json`` and ``prefill_gemm.md`` in ``$GENLM_BENCH_OUT`` or
``benchmarks/out``. Usage::

    .venv/bin/python benchmarks/bench_prefill_gemm.py                   # 4,096 tokens, 2 threads
    .venv/bin/python benchmarks/bench_prefill_gemm.py --prompt 907 --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import OUT_DIR, device_info, device_line, markdown_table  # noqa: E402

#: the target (issue 69, item 5): the prefill within this factor of the GEMM-rate bound
TARGET = 1.5


def model_shapes(folder: Path) -> dict[str, int]:
    cfg = json.loads((folder / "config.json").read_text())
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    return {
        "hidden": hidden,
        "intermediate": int(cfg["intermediate_size"]),
        "layers": int(cfg["num_hidden_layers"]),
        "heads": heads,
        "kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "vocab": int(cfg["vocab_size"]),
    }


def projections(s: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Each layer's projections as (in, out)."""
    q = s["heads"] * s["head_dim"]
    kv = s["kv_heads"] * s["head_dim"]
    return {
        "q": (s["hidden"], q),
        "k": (s["hidden"], kv),
        "v": (s["hidden"], kv),
        "o": (q, s["hidden"]),
        "gate": (s["hidden"], s["intermediate"]),
        "up": (s["hidden"], s["intermediate"]),
        "down": (s["intermediate"], s["hidden"]),
    }


def flops(s: dict[str, int], tokens: int) -> dict[str, float]:
    proj = sum(2.0 * tokens * i * o for i, o in projections(s).values()) * s["layers"]
    attn = 2 * 2.0 * s["heads"] * s["head_dim"] * tokens * (tokens + 1) / 2 * s["layers"]
    head = 2.0 * s["hidden"] * s["vocab"]
    return {"projections": proj, "attention": attn, "lm_head": head, "total": proj + attn + head}


def best_time(fn: Any, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def packed_linear() -> Any:
    """genlm-hf's oneDNN linear over a weight packed once (what its CPU model runs), or
    None where this torch lacks it: the rate is the faster of it and MKL's per shape."""
    try:
        from genlm_hf.cpu_linear import PackedLinear, packing_problem
    except ImportError:
        return None
    import torch

    class Probe(torch.nn.Linear):  # what packing_problem reads of a model: its device and dtype
        device = torch.device("cpu")

    return PackedLinear if packing_problem(Probe(64, 48, bias=False)) is None else None


def gemm_rate(s: dict[str, int], tokens: int, repeats: int) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    x = {i: torch.randn(tokens, i) for i in {i for i, _ in projections(s).values()}}
    per: dict[str, Any] = {}
    total_flops = total_s = 0.0
    packed = packed_linear()
    for name, (i, o) in projections(s).items():
        w = torch.randn(o, i) / i**0.5
        kernels = {"mkl": best_time(lambda w=w, i=i: torch.nn.functional.linear(x[i], w), repeats)}
        if packed is not None:
            layer = packed(w, None)
            kernels["onednn_packed"] = best_time(lambda layer=layer, i=i: layer(x[i]), repeats)
        kernel = min(kernels, key=kernels.__getitem__)
        t = kernels[kernel]
        f = 2.0 * tokens * i * o
        per[name] = {
            "shape": f"{tokens}x{i} @ {i}x{o}",
            "s": t,
            "kernel": kernel,
            "gflops": f / t / 1e9,
            "gflops_by_kernel": {k: f / v / 1e9 for k, v in kernels.items()},
        }
        total_flops += f
        total_s += t
    # attention at one layer's shapes, one 1,024-query chunk over all keys (reported only)
    d, h = s["head_dim"], s["heads"]
    q = torch.randn(h, min(tokens, 1024), d)
    k = torch.randn(h, tokens, d)
    sc = best_time(lambda: torch.bmm(q, k.transpose(1, 2)), repeats)
    attn = {
        "shape": f"{h} x {q.shape[1]}x{d} @ {d}x{tokens}",
        "s": sc,
        "gflops": 2.0 * h * q.shape[1] * tokens * d / sc / 1e9,
    }
    return {"gflops": total_flops / total_s / 1e9, "projections": per, "attention_scores": attn}


async def prefill_time(folder: Path, prompt: list[int], other: list[int], repeats: int) -> dict[str, Any]:
    import genlm_core

    llm = genlm_core.load("hf", model=str(folder))
    try:
        await llm.next_token_logprobs(other)  # warm-up: same length, other tokens
        times = []
        computed = []
        for _ in range(repeats):
            llm.clear_cache()
            before = llm.stats()["engine"].get("tokens_computed", 0)
            t0 = time.perf_counter()
            await llm.next_token_logprobs(prompt)
            times.append(time.perf_counter() - t0)
            computed.append(llm.stats()["engine"].get("tokens_computed", 0) - before)
        return {"s": min(times), "times": times, "tokens_computed": computed}
    finally:
        close = getattr(llm, "close", None)
        if close is not None:
            res = close()
            if asyncio.iscoroutine(res):
                await res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", default="4096", help="a prompt of long_prompts.PROMPTS")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", type=Path, default=None, help="model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--out", type=Path, default=OUT_DIR / "prefill_gemm.json")
    args = p.parse_args(argv)

    import torch
    from long_prompts import PROMPTS, encode
    from transformers import AutoTokenizer

    from genlm_core import models

    torch.set_num_threads(args.threads)
    folder = args.model or models.smollm2_path(progress=False)
    tok = AutoTokenizer.from_pretrained(str(folder))
    prompt = encode(PROMPTS[args.prompt], tok, expect_smollm2=args.model is None)
    other = list(reversed(prompt))
    s = model_shapes(folder)
    n = len(prompt)
    rate = gemm_rate(s, n, max(3, args.repeats))
    pre = asyncio.run(prefill_time(folder, prompt, other, args.repeats))
    if any(c != n for c in pre["tokens_computed"]):
        raise SystemExit(
            f"the prefill computed {pre['tokens_computed']} tokens, not {n} each time: not a clean prefill"
        )
    f = flops(s, n)
    bound = f["total"] / (rate["gflops"] * 1e9)
    result = {
        "machine": device_info("cpu"),
        "threads": args.threads,
        "prompt_tokens": n,
        "model": s,
        "flops": f,
        "gemm": rate,
        "prefill": pre,
        "bound_s": bound,
        "ratio": pre["s"] / bound,
        "target": TARGET,
        "met": pre["s"] / bound <= TARGET,
        "prefill_gflops": f["total"] / pre["s"] / 1e9,
    }
    rows = [
        {
            "what": f"GEMM ({name}: {v['shape']}, {v['kernel']}; "
            + ", ".join(f"{k} {g:.1f}" for k, g in v["gflops_by_kernel"].items())
            + ")",
            "s": f"{v['s'] * 1e3:.1f} ms",
            "GFLOP/s": f"{v['gflops']:.1f}",
        }
        for name, v in rate["projections"].items()
    ]
    rows.append(
        {"what": "GEMM rate, the seven projections together", "s": "", "GFLOP/s": f"{rate['gflops']:.1f}"}
    )
    a = rate["attention_scores"]
    rows.append(
        {
            "what": f"attention scores ({a['shape']}), reported only",
            "s": f"{a['s'] * 1e3:.1f} ms",
            "GFLOP/s": f"{a['gflops']:.1f}",
        }
    )
    rows.append(
        {
            "what": f"bound: {f['total'] / 1e12:.3f} TFLOP (projections {f['projections'] / 1e12:.3f}, attention {f['attention'] / 1e12:.3f}) at the GEMM rate",
            "s": f"{bound:.2f} s",
            "GFLOP/s": f"{rate['gflops']:.1f}",
        }
    )
    rows.append(
        {
            "what": f"genlm-hf prefill of {n} tokens (best of {args.repeats}: {', '.join(f'{t:.2f}' for t in pre['times'])} s)",
            "s": f"{pre['s']:.2f} s",
            "GFLOP/s": f"{result['prefill_gflops']:.1f}",
        }
    )
    md = (
        "## genlm-hf's prefill against the GEMM rate (bench_prefill_gemm.py)\n\n"
        f"{device_line(result['machine'])}, {args.threads} threads, float32.\n\n"
        + markdown_table(rows, ["what", "s", "GFLOP/s"])
        + f"\n\nprefill / bound = **{result['ratio']:.2f}x** (target <= {TARGET}x: {'met' if result['met'] else 'not met'})\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    args.out.with_suffix(".md").write_text(md)
    print(md)
    print(f"(JSON: {args.out})")
    return result


if __name__ == "__main__":
    main()
