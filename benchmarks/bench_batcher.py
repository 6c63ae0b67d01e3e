"""AutoBatcher benchmarks.

1. Overhead of the batcher itself per request (the model does no work), at batch
   sizes 1-256: B concurrent callers each submit R requests in turn, so batches
   fill to B. Target: < 20 us per request at batch 64 on one core.
2. Timer policy on a bursty SMC-like workload: particles do CPU work of random
   length, then ask for a distribution; the model costs a fixed overhead plus a
   cost per row. First-request deadline vs tick vs debounce, wall time and batch
   sizes.
3. Timer policy for a sequential caller (one request at a time, as a client that
   awaits each call in turn): time per call, deadline vs tick.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verdicts  # noqa: E402
from common import write_results  # noqa: E402

# genlm_core is imported where it is used: importing this module for its verdict (run_all
# does) loads none of it


async def overhead(batch: int, total: int, in_thread: bool) -> dict:
    from genlm_core.engine.batching import AutoBatcher

    b = AutoBatcher(lambda reqs: reqs, batch_size=batch, timeout=0.001, run_in_thread=in_thread)
    rounds = max(1, total // batch)

    async def caller(i: int) -> None:
        for r in range(rounds):
            await b.submit(r, key=None)

    await asyncio.gather(*(caller(i) for i in range(batch)))  # warm-up
    b.stats = type(b.stats)()
    t0 = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(batch)))
    dt = time.perf_counter() - t0
    n = rounds * batch
    b.close()
    return {
        "batch_size": batch,
        "thread": in_thread,
        "requests": n,
        "us_per_request": dt / n * 1e6,
        "mean_batch": b.stats.mean_batch_size,
    }


async def smc_policy(policy: str, timeout: float, particles: int, steps: int, seed: int) -> dict:
    from genlm_core.engine.batching import AutoBatcher

    def model(reqs):
        time.sleep(0.004 + 0.0002 * len(reqs))  # fixed + per-row cost
        return reqs

    b = AutoBatcher(model, batch_size=64, timeout=timeout, policy=policy)
    rng = random.Random(seed)
    work = [[rng.expovariate(1 / 0.0003) for _ in range(steps)] for _ in range(particles)]

    async def particle(i: int) -> None:
        for s in range(steps):
            end = time.perf_counter() + work[i][s]
            while time.perf_counter() < end:  # CPU work that blocks the loop, like real particles
                pass
            await b.submit((i, s))
            await asyncio.sleep(0)

    t0 = time.perf_counter()
    await asyncio.gather(*(particle(i) for i in range(particles)))
    dt = time.perf_counter() - t0
    st = b.stats
    b.close()
    return {
        "policy": policy,
        "timeout_ms": timeout * 1e3,
        "particles": particles,
        "wall_s": dt,
        "batches": st.batches,
        "mean_batch": st.mean_batch_size,
        "mean_wait_ms": st.mean_queue_wait * 1e3,
    }


async def sequential(policy: str, timeout: float, calls: int) -> dict:
    from genlm_core.engine.batching import AutoBatcher

    def model(reqs):
        time.sleep(0.0001)  # a cheap model call, so the timer policy dominates
        return reqs

    b = AutoBatcher(model, batch_size=64, timeout=timeout, policy=policy)
    await b.submit(-1)  # warm-up (starts the worker thread)
    t0 = time.perf_counter()
    for i in range(calls):
        await b.submit(i)
    dt = time.perf_counter() - t0
    b.close()
    return {"policy": policy, "timeout_ms": timeout * 1e3, "calls": calls, "us_per_call": dt / calls * 1e6}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    total = 4096 if args.quick else 32768
    rows = []
    for in_thread in (False, True):
        for bs in (1, 4, 16, 64, 256):
            rows.append(asyncio.run(overhead(bs, total if bs > 1 else total // 8, in_thread)))
    pol = []
    for policy in ("deadline", "tick", "debounce"):
        for timeout in (0.001, 0.005):
            pol.append(asyncio.run(smc_policy(policy, timeout, 32, 10 if args.quick else 30, 0)))
    seq = []
    for policy in ("deadline", "tick"):
        for timeout in (0.001, 0.002):
            seq.append(asyncio.run(sequential(policy, timeout, 200 if args.quick else 2000)))
    write_results("batcher_overhead", rows)
    write_results("batcher_policy", pol)
    write_results("batcher_sequential", seq)


# ---------------------------------------------------------------------- verdict
def headline(result: dict) -> list[dict]:
    """The summary's rows from ``batcher_overhead.json``: batch 64 on the worker thread."""
    r = [x for x in result["rows"] if x["thread"] and x["batch_size"] == 64]
    if not r:
        return []
    us = r[0]["us_per_request"]
    return [
        verdicts.row("batcher overhead, us/request (batch 64, worker thread)", us, target="< 20", met=us < 20)
    ]


if __name__ == "__main__":
    main()
