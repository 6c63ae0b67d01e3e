"""genlm-hf calls whose contexts nest or fork before any prefix is kept: passes, tokens
computed and seconds per call.

The shapes that used to run one pass per token (and raise RecursionError at ~1,000
tokens), each on a cleared cache:

* ``nested 299+300``: a context and its one-token extension;
* ``continuation 300+31``: a 300-token prompt and a 31-token continuation scored token by
  token, in one batch (32 contexts);
* ``siblings N``: ``P+[a,b], P+[a,c], P+[d,e]`` for a new prompt ``P`` of N tokens.

Each row reports the tokens the call's prefix tree needs (the minimum), the tokens the
engine computed, its passes over the KV pool and the call's wall time (median of
``--repeats``). A call that raised reports its error. Run it on a quiet machine::

    .venv/bin/python benchmarks/bench_nested_calls.py --out benchmarks/results/nested_calls.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any


def cases(vocab: int, seed: int = 0) -> dict[str, list[tuple[int, ...]]]:
    rng = random.Random(seed)

    def text(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(3, vocab) for _ in range(n))

    out = {}
    ctx = text(300)
    out["nested 299+300"] = [ctx[:299], ctx]
    prompt, cont = text(300), text(31)
    out["continuation 300+31"] = [prompt + cont[:k] for k in range(32)]
    for n in (940, 997, 1100):
        p = text(n)
        a, b, c, d, e = rng.sample(range(3, vocab), 5)
        out[f"siblings {n}"] = [p + (a, b), p + (a, c), p + (d, e)]
    return out


def minimum(contexts: list[tuple[int, ...]]) -> int:
    return len({c[:n] for c in contexts for n in range(1, len(c) + 1)})


def run(model: str, repeats: int, threads: int) -> dict[str, Any]:
    import torch

    import genlm_core

    torch.set_num_threads(threads)
    llm = genlm_core.load("hf", model=model, dtype="float32", device="cpu", cache_size=0, batch_size=64)
    rows = []
    try:
        for name, contexts in cases(llm.vocab_size).items():
            row: dict[str, Any] = {
                "case": name,
                "contexts": len(contexts),
                "minimum_tokens": minimum(contexts),
            }
            walls = []
            try:
                for _ in range(repeats):
                    llm.clear_cache()
                    before = dict(llm.stats()["engine"])
                    t0 = time.perf_counter()
                    llm.batch_next_token_logprobs_sync(contexts)
                    walls.append(time.perf_counter() - t0)
                    after = llm.stats()["engine"]
                row["tokens_computed"] = after["tokens_computed"] - before["tokens_computed"]
                row["passes"] = after.get("pool_passes", 0) - before.get("pool_passes", 0)
                row["seconds"] = statistics.median(walls)
            except Exception as exc:  # noqa: BLE001 - a case that raises is a result
                row["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        llm.close()
    return {
        "model": model,
        "threads": threads,
        "repeats": repeats,
        "machine": platform.processor(),
        "rows": rows,
    }


def table(result: dict[str, Any]) -> str:
    lines = ["| case | minimum tokens | tokens computed | passes | seconds |", "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['minimum_tokens']} | {r['error']} | | |")
        else:
            lines.append(
                f"| {r['case']} | {r['minimum_tokens']} | {r['tokens_computed']} | {r['passes']} | {r['seconds']:.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a model folder (default: the embedded SmolLM2-135M)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="JSON file (a .md table beside it)")
    args = p.parse_args(argv)
    if args.model is None:
        from genlm_core.testing import models

        args.model = str(models.smollm2())
    result = run(args.model, args.repeats, args.threads)
    print(table(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(table(result) + "\n")
    return result


if __name__ == "__main__":
    main()
