"""Tokens computed past a KV budget without a model: the core's KV reuse over genlm-hf's pool.

The tokens an engine computes under a budget follow from the calls and the release rule
alone, not from the model's numbers. This runs the calls of SIS over a long prompt (the
prompt, then every particle one token further, ``tokens - 1`` times; particles distinct)
through the core's :class:`~genlm_core.engine.kv_calls.KVCalls` around an engine that
keeps genlm-hf's real :class:`~genlm_hf.pool.KVPool` page accounting (forks, copies on
write, ``pages_to_extend``) and computes nothing, at a grid of ``kv_cache_bytes``, for
each release rule, beside the bound of :mod:`genlm_core.engine.kv_resident` (in pages).
``before`` is genlm-hf as it was: ``"leaves"`` with the room a row may take counted by
``KVPool.pages_for`` (a page per row for a copy on write).
Seconds on a CPU; ``bench_long_prompt.py`` measures the same with the model.

Usage::

    .venv/bin/python benchmarks/bench_kv_budget_grid.py                    # 907x32x30, 44..128 MiB
    .venv/bin/python benchmarks/bench_kv_budget_grid.py --mib 48 64 96 --release resident leaves
"""

from __future__ import annotations

import argparse
import random
from typing import Any

#: SmolLM2-135M's KV in float32: 30 layers x 2 x 3 heads x 64 x 4 bytes a token
COLUMN_BYTES = 46080


def sis_calls(prompt: int, particles: int, tokens: int, seed: int = 0) -> list[list[tuple[int, ...]]]:
    rng = random.Random(seed)
    base = tuple(rng.randrange(1000, 50_000) for _ in range(prompt))
    tails: list[list[int]] = [[] for _ in range(particles)]
    calls = [[base]]
    for _ in range(1, tokens):
        for i, t in enumerate(tails):
            t.append(i * 1000 + rng.randrange(1, 1000))
        calls.append([base + tuple(t) for t in tails])
    return calls


def tokens_computed(calls: list[list[tuple[int, ...]]], kv_cache_bytes: int, release: str) -> dict[str, Any]:
    """The core's counters after ``calls`` on a pool of ``kv_cache_bytes``."""
    import torch
    from genlm_hf.pool import PAGE, KVLayout, KVPool, KVSeq

    from genlm_core.config import BackendConfig
    from genlm_core.engine import Engine, KVCacheOptions
    from genlm_core.engine.kv_calls import KVCalls
    from genlm_core.engine.kv_rows import KVPolicy, ResumeRow, RowsOut

    class Config(KVCacheOptions, BackendConfig):
        pass

    class PoolOnly(Engine):
        supports = frozenset({"resume"})

        def __init__(self) -> None:
            layout = KVLayout(1, 1, 1, torch.float32, torch.device("cpu"))  # a page of the same count
            pages = kv_cache_bytes // (COLUMN_BYTES * PAGE)
            self.pool = KVPool(layout, pages * layout.page_bytes)

        def kv_policy(self) -> KVPolicy:
            rule = "leaves" if release == "before" else release
            return KVPolicy(budget=None, release=rule, read_off=True, branch_tokens=32)  # type: ignore[arg-type]

        def kv_size(self, payload: Any) -> int:
            return 0

        def kv_owner(self, payload: Any) -> Any:
            return payload

        def release_kv(self, owner: Any) -> None:
            owner.release()

        def kv_shortfall(self, rows: list[ResumeRow]) -> int:
            pool = self.pool
            if release == "before":
                return pool.shortfall(pool.pages_for((len(r.context), r.depth) for r in rows))
            return pool.shortfall(pool.pages_to_extend((r.payload, r.depth, len(r.context)) for r in rows))

        def forward_rows(self, rows: list[ResumeRow]) -> RowsOut:
            kept: list[tuple[tuple[int, ...], Any]] = []
            for r in rows:
                seq = r.payload.fork(r.depth) if r.payload is not None else KVSeq(self.pool)
                seq.extend(r.new_tokens)
                kept += [(r.context[:n], seq.fork(n)) for n in r.read_off]
                kept.append((r.context, seq))
            return RowsOut([None] * len(kept), kept)

    engine = PoolOnly()
    kv = KVCalls(engine, Config(), "pool")
    for contexts in calls:
        kv.forward(contexts)
    return {**kv.stats(), "pages": engine.pool.max_pages}


def main(argv: list[str] | None = None) -> None:
    from genlm_hf.pool import PAGE

    from genlm_core.engine.kv_resident import sis_token_bound

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="907x32x30", help="PROMPTxPARTICLESxTOKENS")
    p.add_argument("--mib", nargs="+", type=int, default=list(range(44, 129, 4)))
    p.add_argument(
        "--release", nargs="+", default=["before", "resident"], help="before, resident, leaves, lru"
    )
    args = p.parse_args(argv)
    prompt, particles, tokens = map(int, args.shape.split("x"))
    calls = sis_calls(prompt, particles, tokens)
    low = prompt + particles * (tokens - 1)
    print(f"SIS {args.shape}: minimum {low} tokens; x min per kv_cache_bytes (tokens computed)\n")
    print("| MiB | pages | bound | " + " | ".join(args.release) + " |")
    print("|---:|---:|---:|" + "---:|" * len(args.release))
    for mib in args.mib:
        got = [tokens_computed(calls, mib << 20, rule) for rule in args.release]
        pages = got[0]["pages"]
        bound = sis_token_bound(pages - 1, prompt, particles, tokens, PAGE)  # less the reserved page
        cells = [f"{g['tokens_computed'] / low:.2f} ({g['tokens_computed']:,})" for g in got]
        print(f"| {mib} | {pages} | {bound / low:.2f} ({bound:,}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
