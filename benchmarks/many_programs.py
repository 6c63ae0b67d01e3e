"""Many programs, one engine: K programs, each with its own prompt, one after another and together.

The shape of an evaluation over a dataset (as genlm-eval runs one): every instance is a
program with its own long prompt and its own particles, and the instances run at once
against one engine. :func:`many_runs` runs K such programs (``sis_workload.sis`` or
``smc_workload.smc``; program ``i``: prompt ``i``, seed ``seed + i``) on one engine:

1. a warm-up (``none`` in a smoke run): program 0 alone (its shape with another seed;
   ``short``: 2 particles x 2 tokens), so that what the engine prepares once is not in a figure, and the memory one
   program needs is measured before any run of all of them;
2. then ``repeats`` times: **one after another** - each program alone from clean caches
   (its calls, wall time, tokens computed, minimum, peak RSS) - then **together** - the
   K programs started at once (``asyncio.gather``) from clean caches (the calls, the
   wall time from the common start to the last program's end, tokens computed, the
   minimum of every context any program asked for, peak RSS; and each program's own
   calls/s, from the common start to its own end: the slowest against the mean says
   whether a program starves).

Figures (the median repeat's times; the counters of the last repeat):

  calls_per_s            together: all calls / the wall time
  sequential_calls_per_s one after another: all calls / the sum of the K wall times
  over_sequential        the two's ratio (the issue's target: >= 0.9)
  peak ratio             the runs' peak RSS together / the largest of one program's alone
                         (each peak reset before its run, so a later run's includes what an
                         earlier one left allocated; the first repeat's one-program peaks)
  x min                  tokens computed together / the minimum (every prompt once, every
                         particle's own tokens once): 1.0 holds each prompt once
  slowest / mean         the slowest program's calls/s together against the K programs' mean

Standard library only at import (the worker imports it; torch is the programs').
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prefix_tree import PrefixTree

NextLogprobs = Callable[[list[int]], Awaitable[Any]]
#: a program as ``sis_workload.timed_runs`` calls it
Program = Callable[..., Awaitable[dict[str, Any]]]


@dataclass
class Hooks:
    """What a run needs of the engine and the process that holds it.

    ``call``: its ``next_token_logprobs``; ``reset``: clear its caches; ``tokens``: its
    ``tokens_computed`` so far; ``rss``: the holding process's resident bytes now;
    ``reset_peak``: reset that process's peak RSS (False where it cannot); ``peak``: its
    peak RSS since; ``phase``: told each phase's name; ``on_call``: each call's tree."""

    call: NextLogprobs
    reset: Callable[[], None]
    tokens: Callable[[], int]
    rss: Callable[[], int]
    reset_peak: Callable[[], bool]
    peak: Callable[[], int]
    phase: Callable[[str], None] = lambda name: None
    on_call: Callable[[PrefixTree], None] | None = None


async def _one(
    program: Program,
    call: NextLogprobs,
    vocab: Any,
    eos_id: int,
    prompt: list[int],
    particles: int,
    tokens: int,
    seed: int,
    t0: float,
) -> dict[str, Any]:
    """One program from ``t0``: its calls and its end (seconds after ``t0``)."""
    res = await program(call, vocab, eos_id, prompt, n_particles=particles, max_tokens=tokens, seed=seed)
    return {"calls": res["calls"], "steps": res["steps"], "end_s": time.perf_counter() - t0}


def _memory(hooks: Hooks, before: int, reset: bool) -> dict[str, Any]:
    return {"rss_before_bytes": before, "run_peak_bytes": hooks.peak() if reset else None}


async def sequential(
    hooks: Hooks,
    program: Program,
    prompts: Sequence[list[int]],
    vocab: Any,
    eos_id: int,
    particles: int,
    tokens: int,
    seed: int,
) -> dict[str, Any]:
    """Each program alone from clean caches, one after another."""
    runs = []
    for i, prompt in enumerate(prompts):
        hooks.reset()
        tree = PrefixTree(shared=prompt)
        before, reset = hooks.rss(), hooks.reset_peak()
        done = hooks.tokens()
        t0 = time.perf_counter()
        res = await _one(
            program,
            tree.wrap(hooks.call, hooks.on_call),
            vocab,
            eos_id,
            prompt,
            particles,
            tokens,
            seed + i,
            t0,
        )
        runs.append(
            {
                "calls": res["calls"],
                "steps": res["steps"],
                "wall_s": res["end_s"],
                "tokens_computed": hooks.tokens() - done,
                "minimum_tokens": tree.tokens,
                "recorder_s": tree.own_s,
                **_memory(hooks, before, reset),
            }
        )
    calls, wall = sum(r["calls"] for r in runs), sum(r["wall_s"] for r in runs)
    return {
        "calls": calls,
        "wall_s": wall,
        "calls_per_s": calls / wall,
        "tokens_computed": sum(r["tokens_computed"] for r in runs),
        "minimum_tokens": sum(r["minimum_tokens"] for r in runs),
        "programs": runs,
    }


async def together(
    hooks: Hooks,
    program: Program,
    prompts: Sequence[list[int]],
    vocab: Any,
    eos_id: int,
    particles: int,
    tokens: int,
    seed: int,
) -> dict[str, Any]:
    """The programs started at once from clean caches; one tree counts every context
    (a token two prompts share counts once: the engine may hold it once)."""
    hooks.reset()
    tree = PrefixTree(prompts=prompts)
    call = tree.wrap(hooks.call, hooks.on_call)
    before, reset = hooks.rss(), hooks.reset_peak()
    done = hooks.tokens()
    t0 = time.perf_counter()
    res = await asyncio.gather(
        *[
            _one(program, call, vocab, eos_id, p, particles, tokens, seed + i, t0)
            for i, p in enumerate(prompts)
        ]
    )
    wall = time.perf_counter() - t0
    ran = hooks.tokens() - done
    rates = [r["calls"] / r["end_s"] for r in res]
    calls = sum(r["calls"] for r in res)
    mean = statistics.fmean(rates)
    return {
        "calls": calls,
        "wall_s": wall,
        "calls_per_s": calls / wall,
        "tokens_computed": ran,
        "minimum_tokens": tree.tokens,
        "recorder_s": tree.own_s,
        "programs": [{**r, "calls_per_s": rate} for r, rate in zip(res, rates, strict=True)],
        "slowest_calls_per_s": min(rates),
        "mean_calls_per_s": mean,
        "slowest_over_mean": min(rates) / mean,
        **_memory(hooks, before, reset),
    }


async def many_runs(
    hooks: Hooks,
    prompts: Sequence[list[int]],
    vocab: Any,
    eos_id: int,
    *,
    particles: int,
    tokens: int,
    seed: int,
    repeats: int,
    program: Program,
    full_warmup: bool = True,
    warmup: bool = True,
) -> dict[str, Any]:
    """The warm-up (``warmup=False``: none, a run that reads counters alone), then
    ``repeats`` x (one after another, together); see the module."""
    if not prompts:
        raise ValueError("many_runs needs at least one program's prompt")
    if warmup:
        hooks.phase("warm-up")
        hooks.reset()
        n, k = (particles, tokens) if full_warmup else (2, 2)
        await program(hooks.call, vocab, eos_id, prompts[0], n_particles=n, max_tokens=k, seed=seed + 10_000)
    seq, tog = [], []
    for r in range(repeats):
        hooks.phase(f"run {r + 1}: one after another")
        seq.append(await sequential(hooks, program, prompts, vocab, eos_id, particles, tokens, seed))
        hooks.phase(f"run {r + 1}: together")
        tog.append(await together(hooks, program, prompts, vocab, eos_id, particles, tokens, seed))
    return summarise(seq, tog)


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of the median wall time."""
    return sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]


def summarise(seq: list[dict[str, Any]], tog: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of :func:`many_runs` from its repeats (see the module)."""
    s, t = _median(seq), _median(tog)
    one = [p["run_peak_bytes"] for p in seq[0]["programs"]]
    peaks = [r["run_peak_bytes"] for r in tog]
    one_peak = max(one) if None not in one else None
    peak = max(peaks) if None not in peaks else None
    return {
        "calls": t["calls"],
        "wall_s": t["wall_s"],
        "walls": [r["wall_s"] for r in tog],
        "calls_per_s": t["calls_per_s"],
        "sequential_calls_per_s": s["calls_per_s"],
        "sequential_walls": [r["wall_s"] for r in seq],
        "over_sequential": t["calls_per_s"] / s["calls_per_s"],
        "tokens_computed": tog[-1]["tokens_computed"],
        "minimum_tokens": tog[-1]["minimum_tokens"],
        "sequential_tokens_computed": seq[-1]["tokens_computed"],
        "sequential_minimum_tokens": seq[-1]["minimum_tokens"],
        "slowest_calls_per_s": t["slowest_calls_per_s"],
        "mean_calls_per_s": t["mean_calls_per_s"],
        "slowest_over_mean": t["slowest_over_mean"],
        "one_program_peak_bytes": one_peak,
        "together_peak_bytes": peak,
        "peak_over_one_program": peak / one_peak if peak and one_peak else None,
        "together": tog[-1],
        "sequential": seq[-1],
        "recorder_s": tog[-1]["recorder_s"],
    }
