"""genlm serve's gatherer, on its own: does holding a request for the other clients pay?

``genlm_core.serve.gather.Gatherer`` holds a client's rows request while other active
clients have none waiting, so that their rows share one forward pass. Whether that pays
depends on two measured quantities: how much of a pass is fixed (paid once per pass,
whatever its rows) and how long a client takes between a reply and its next request (its
particles' masking and sampling, and the wire). This benchmark runs the real
``Gatherer`` and the real ``AutoBatcher`` in front of an engine that costs ``a + b x
rows`` ms a pass (``time.sleep`` in the batcher's thread, as a GPU step leaves the
interpreter free), with clients whose turnaround is ``N(work, sd) + wire`` ms
(``asyncio.sleep``: in ``bench_serve`` the clients are processes of their own), in the
shape of ``bench_serve`` (4 clients of 16 rows), under three policies:

- ``off``: no gathering (``gather_s=0``): the batcher alone merges what queued behind a
  running pass;
- ``hold``: the rule before this benchmark: once the engine is idle, wait up to a quarter
  of the last pass for every missing client;
- ``due`` (genlm-core's): the same bound, but only for missing clients due within it
  (their last reply plus their turnaround's moving average).

Two regimes, with the parameters measured by ``bench_serve``'s accounting (SmolLM2-135M
float32, 4 clients x 16 particles; the spread ``sd`` of a client's work is not measured
there and is a parameter):

- ``h100``: one NVIDIA H100 (``results/gpu/nvidia-h100-80gb-hbm3/serve-*.json``): a pass
  9.2 ms whatever its rows (``hf_step_grow``: 9.15 ms for 16 rows, 9.25 for 64), a client
  37.3 ms of its own work and ~6 ms of wire per step;
- ``cpu``: this 2-core machine (``results/serve.json``): a pass of 64 rows 362 ms, of 16
  rows ~138 ms, a client 58 ms and ~8 ms of wire; every time divided by ``--cpu-scale`` (4)
  so that a run takes seconds (the policies compare times with times: scale-free but for
  the event loop's ~0.1 ms).

Reports, per regime and policy (medians over ``--repeats`` seeds): the cycle (ms from one
reply of a client to its next), calls/s (rows per second, all clients), rows per pass,
and the hold per request.

    python benchmarks/bench_gather.py             # JSON + table in benchmarks/out/
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verdicts  # noqa: E402
from common import write_results  # noqa: E402

# genlm_core is imported where it is used: importing this module for its verdict (run_all
# does) loads none of it

#: (fixed ms a pass, ms a row, client work ms, wire ms): see the module
REGIMES: dict[str, tuple[float, float, float, float]] = {
    "h100": (9.2, 0.002, 37.3, 6.0),
    "cpu": (64.0, 4.65, 58.0, 8.0),
}
POLICIES = ("off", "hold", "due")


def gatherer(policy: str, gather_s: float) -> Any:
    from genlm_core.serve.gather import Gatherer

    class HoldForAll(Gatherer):  # the rule before: every missing client is expected
        def _expected_by(self, client: str, now: float, deadline: float, budget: float) -> bool:
            return True

    if policy == "off":
        return Gatherer(0.0)
    return (HoldForAll if policy == "hold" else Gatherer)(gather_s)


async def one_run(
    policy: str,
    regime: tuple[float, float, float, float],
    scale: float,
    sd: float,
    clients: int,
    rows: int,
    steps: int,
    seed: int,
    gather_s: float,
) -> dict[str, float]:
    from genlm_core.engine.batching import AutoBatcher

    a, b, work, wire = (x / scale for x in regime)
    sd /= scale
    rng = random.Random(seed)
    passes: list[int] = []

    def engine(reqs: list[Any]) -> list[int]:
        time.sleep((a + b * len(reqs)) / 1000)
        passes.append(len(reqs))
        return [0] * len(reqs)

    batcher = AutoBatcher(engine, batch_size=clients * rows)
    g = gatherer(policy, gather_s)
    cycles: list[float] = []
    warm = max(2, steps // 6)

    async def client(c: int) -> None:
        name = f"client-{c}"
        await asyncio.sleep(rng.uniform(0, work) / 1000)  # clients start out of phase
        last = None
        for s in range(steps):
            await asyncio.sleep(max(0.0, rng.gauss(work, sd)) / 1000 + wire / 2000)
            await g.arrive(name)
            try:
                await asyncio.gather(*(batcher.submit((c, s, i)) for i in range(rows)))
            finally:
                g.leave(name)
            await asyncio.sleep(wire / 2000)
            now = time.monotonic()
            if last is not None and s >= warm:
                cycles.append(now - last)
            last = now

    await asyncio.gather(*(client(c) for c in range(clients)))
    batcher.close()
    cycle_ms = 1000 * statistics.mean(cycles) * scale
    return {
        "cycle_ms": cycle_ms,
        "calls_per_s": clients * rows / cycle_ms * 1000,
        "rows_per_pass": statistics.mean(passes),
        "held_ms_per_request": 1000 * g.held_s / (clients * steps) * scale,
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for name in args.regimes:
        scale = args.cpu_scale if name == "cpu" else 1.0
        for policy in POLICIES:
            runs = [
                asyncio.run(
                    one_run(
                        policy,
                        REGIMES[name],
                        scale,
                        args.sd,
                        args.clients,
                        args.rows,
                        args.steps,
                        seed,
                        args.gather_s,
                    )
                )
                for seed in range(args.repeats)
            ]
            row: dict[str, Any] = {"regime": name, "policy": policy, "sd_ms": args.sd}
            for key in runs[0]:
                row[key] = statistics.median(r[key] for r in runs)
            out.append(row)
            print(row, flush=True)
    for name in args.regimes:
        by = {r["policy"]: r for r in out if r["regime"] == name}
        out.append(
            {
                "regime": name,
                "policy": "due/hold calls/s",
                "calls_per_s": by["due"]["calls_per_s"] / by["hold"]["calls_per_s"],
            }
        )
    return out


def headline(result: dict) -> list[dict]:
    """The summary's rows from ``gather.json``: in the H100's regime waiting only for the
    clients due in time must not be slower than holding for all (it was 4-7% faster), and
    in the CPU's it must gather as holding for all does (rows per pass)."""
    by = {(r["regime"], r["policy"]): r for r in result["rows"]}
    out = []
    #: (regime, figure, its words, the share of holding-for-all's figure that meets it)
    for regime, key, words, share in (
        ("h100", "calls_per_s", "H100 regime: calls/s", 1.0),
        ("cpu", "rows_per_pass", "CPU regime: rows per pass", 0.95),
    ):
        if (regime, "due") not in by or (regime, "hold") not in by:
            continue
        due, hold = by[(regime, "due")][key], by[(regime, "hold")][key]
        out.append(
            verdicts.row(
                f"gather, {words}, due-only vs hold-for-all",
                round(due, 1),
                round(hold, 1),
                round(due / hold, 3),
                target=f">= {share:g}",
                met=due >= share * hold,
            )
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    ap.add_argument("--sd", type=float, default=3.0, help="spread (ms) of a client's own work a step")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rows", type=int, default=16, help="rows a client asks for a step")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3, help="seeds per policy (medians reported)")
    ap.add_argument("--gather-s", type=float, default=0.1, help="the server's gather_s (its default)")
    ap.add_argument("--cpu-scale", type=float, default=4.0, help="the cpu regime's times divided by this")
    ap.add_argument("--quick", action="store_true", help="20 steps, one seed")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.repeats = 20, 1
    rows = run(args)
    write_results("gather", rows, extra={"config": vars(args)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
