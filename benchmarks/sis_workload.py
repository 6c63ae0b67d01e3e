"""The SIS benchmark's workload: genlm-backend's README program, timed.

The program itself is :mod:`genlm_core.tools.sis` (the one SIS there is: ``genlm sample``
runs it too); this module gives it the benchmarks' calling shape and the timed runs.
Kept apart from ``bench_sis.py`` so that every process that runs it imports the same
code: genlm-core's backends in this venv, and genlm-backend 0.3.1 in the anchor venv
(``bench_sis.py --anchor-worker``), which has no genlm-core and so loads
``genlm_core/tools/sis.py`` by its path (:func:`program`). Importing this module loads
neither genlm-core nor torch: ``run_all.py`` imports the benchmarks for their verdicts.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

#: the program's file, for a process without genlm-core (the anchor venv)
SIS_FILE = Path(__file__).resolve().parents[1] / "genlm_core" / "tools" / "sis.py"


def log(msg: str) -> None:
    print(f"[bench_sis {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


NextLogprobs = Callable[[list[int]], Awaitable[Any]]
#: a program as ``timed_runs`` calls it: ``(next_logprobs, vocab, eos_id, prompt_ids, *,
#: n_particles, max_tokens, seed)`` -> its figures (``particles``, ``calls``, ``steps``, ``copy_s``, ``sample_s``)
Program = Callable[..., Awaitable[dict[str, Any]]]


@functools.cache
def program() -> ModuleType:
    """:mod:`genlm_core.tools.sis`, imported where genlm-core is installed; elsewhere (the
    anchor venv: genlm-backend 0.3.1, no genlm-core) the same file loaded by its path,
    which needs only torch."""
    try:
        from genlm_core.tools import sis

        return sis
    except ImportError:
        spec = importlib.util.spec_from_file_location("genlm_core_tools_sis", SIS_FILE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # before running it: its dataclasses look their module up
        spec.loader.exec_module(module)
        return module


def figures(run: Any) -> dict[str, Any]:
    """A :class:`~genlm_core.tools.sis.ParticleRun` as the benchmarks record it."""
    return {
        "particles": run.particles,
        "calls": run.calls,
        "steps": run.steps,
        "copy_s": run.copy_s,
        "sample_s": run.sample_s,
    }


# ---------------------------------------------------------------------- workload
async def sis(
    next_logprobs: NextLogprobs,
    token_lengths: Sequence[int],
    eos_id: int,
    prompt_ids: list[int],
    *,
    n_particles: int = 16,
    max_tokens: int = 20,
    max_token_length: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """The README's autobatched SIS (:func:`genlm_core.tools.sis.run_particles` with the
    README's mask: tokens of at most ``max_token_length`` bytes, empty ones included).
    Returns the particles, the number of calls and steps, and the program's own time."""
    sis = program()
    valid = sis.length_mask(token_lengths, eos_id, max_token_length, min_token_length=0)
    mask = sis.masking_function(valid, eos_id, max_tokens)
    run = await sis.run_particles(next_logprobs, prompt_ids, mask, eos_id, n_particles=n_particles, seed=seed)
    return figures(run)


async def timed_runs(
    make_next: Callable[[], NextLogprobs],
    token_lengths: Sequence[int],
    eos_id: int,
    prompt_ids: list[int],
    args: argparse.Namespace,
    reset: Callable[[], None] = lambda: None,
    tokens: Callable[[], int] = lambda: 0,
    full_warmup: bool = True,
    program: Program | None = None,
    warmup: bool = True,
) -> dict[str, Any]:
    """A warm-up run, then ``args.repeats`` timed runs from clean caches (median reported).

    The warm-up is the timed runs' shape (``args.particles`` x ``args.max_tokens``, another
    seed): every batch size and length a timed run meets has run once, so what a backend
    prepares once per shape (a GPU's captured decode graphs, which clearing the caches
    keeps) is not in the figure, as a program's later runs do not pay it.
    ``full_warmup=False``: 2 particles x 2 tokens (a backend with nothing to prepare per
    shape, whose every call costs the same). ``warmup=False``: none (a run that reads
    counters alone: a smoke run).

    ``program``: the program run (default :func:`sis`), called as ``sis`` is, with
    ``token_lengths`` as its second argument (``smc_workload.smc`` takes the byte
    vocabulary there); ``program_result`` holds what the last timed run returned (less its particles)."""
    program = program or sis
    n, k = (args.particles, args.max_tokens) if full_warmup else (2, 2)
    if warmup:
        reset()
        await program(
            make_next(), token_lengths, eos_id, prompt_ids, n_particles=n, max_tokens=k, seed=args.seed + 1
        )
    walls, calls, texts, ran, own = [], 0, [], 0, []
    for _ in range(args.repeats):
        reset()
        next_lp = make_next()
        before = tokens()
        t0 = time.perf_counter()
        res = await program(
            next_lp,
            token_lengths,
            eos_id,
            prompt_ids,
            n_particles=args.particles,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
        walls.append(time.perf_counter() - t0)
        log(f"  run: {res['calls']} calls in {walls[-1]:.2f} s")
        ran = tokens() - before
        calls = res["calls"]
        texts = [p.context for p in res["particles"]]
        own.append({k: res[k] for k in ("steps", "copy_s", "sample_s")})
    wall = statistics.median(walls)
    return {
        "calls": calls,
        "wall_s": wall,
        "calls_per_s": calls / wall,
        "walls": walls,
        "contexts": texts,
        "tokens_computed_per_run": ran,
        "program": program_account(walls, own, calls),
        "program_result": {k: v for k, v in res.items() if k != "particles"},
    }


def program_account(walls: list[float], own: list[dict[str, Any]], calls: int) -> dict[str, Any]:
    """Where a run's time went, from the median run: the program's own work per call
    (``copy_ms``: the row's ``.float().cpu()``, which on a GPU also waits for the device's
    queued work; ``sample_ms``: masking, normalising and drawing on the CPU), and the rest
    of a step (``outside_ms_per_step``: the backend's calls, batching and forward passes,
    as the program sees them). ``calls_per_s_program_only``: the rate if the backend took
    no time at all, the ceiling any backend can reach on this program and machine."""
    i = sorted(range(len(walls)), key=walls.__getitem__)[len(walls) // 2]
    run, wall = own[i], walls[i]
    program_s = run["copy_s"] + run["sample_s"]
    return {
        "steps": run["steps"],
        "copy_ms_per_call": 1e3 * run["copy_s"] / calls,
        "sample_ms_per_call": 1e3 * run["sample_s"] / calls,
        "outside_ms_per_step": 1e3 * (wall - program_s) / run["steps"],
        "program_share": program_s / wall,
        "calls_per_s_program_only": calls / program_s if program_s > 0 else None,
    }
