"""Random programs: what SIS, SMC, beams and byte-level models do to their contexts, step
by step, for the conformance kit (:meth:`LogprobBackendConformance.test_random_programs`).

A program is a list of steps, each the distinct contexts asked in one round. From one step
to the next each live context takes one token (a particle's step), forks into several
(a beam's candidates, SMC's resampled particles), jumps several tokens (a new
tokenisation of a byte-level model), backs up and diverges, is asked again one step later
(a re-asked context), or dies; now and then a new prompt joins. A backend that keeps
state between calls - an output cache, KV of prefixes, rows resident on static buffers, a
server's caches - meets every transition of it, through batch calls, concurrent single
calls and cache clears in between; each row is then compared with the context computed
alone, without any cache (the oracle: the backend's ``next_token_logprobs_uncached``, or
a single call after ``clear_cache`` where it has none).

Found with such programs, before the kit ran them: genlm-hf's static path raising
``TypeError`` on a one-token context when its buffers were full, and reading a prefix
from a row that an earlier eager pass of the same call had overwritten.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["alone", "program_steps", "random_program", "run_program"]

Context = tuple[int, ...]


def random_program(
    tokens: Sequence[int],
    seed: int,
    steps: int = 8,
    width: int = 12,
    max_len: int = 48,
    prompt_lengths: tuple[int, int] = (1, 8),
) -> list[list[Context]]:
    """``steps`` rounds of at most ``width`` distinct contexts of ``tokens`` (ids), none
    longer than ``max_len`` (a longer one keeps its last ``max_len`` ids: a new context);
    the first contexts have between ``prompt_lengths[0]`` and ``prompt_lengths[1]`` ids."""
    rng = random.Random(seed)

    def new(k: int) -> Context:
        return tuple(rng.choice(tokens) for _ in range(k))

    lo, hi = prompt_lengths
    live = [new(rng.randint(lo, hi)) for _ in range(rng.randint(1, max(1, width // 2)))]
    program = [live]
    for _ in range(1, steps):
        out: list[Context] = []
        for c in live:
            r = rng.random()
            if r < 0.5:  # one token
                out.append(c + new(1))
            elif r < 0.7:  # forked
                out += [c + new(1) for _ in range(rng.randint(2, 3))]
            elif r < 0.8:  # a jump of several tokens
                out.append(c + new(rng.randint(2, 12)))
            elif r < 0.88 and len(c) > 2:  # backed up, then diverging
                out.append(c[: -rng.randint(1, min(len(c) - 1, 8))] + new(rng.randint(1, 3)))
            elif r < 0.95:  # asked again
                out.append(c)
            # else: it dies
        if rng.random() < 0.25:  # a new prompt
            out.append(new(rng.randint(1, max_len)))
        rng.shuffle(out)
        out = list(dict.fromkeys(c[-max_len:] for c in out))[:width]
        live = out or [new(rng.randint(1, 8))]
        program.append(live)
    return program


def run_program(backend: Any, program: list[list[Context]], seed: int) -> list[list[Any]]:
    """Each step's rows, through the ways a program calls: one batch call, concurrent
    single calls (the auto-batcher's calls), with the caches cleared before some steps."""
    return list(program_steps(backend, program, seed))


def program_steps(backend: Any, program: list[list[Context]], seed: int) -> Iterator[list[Any]]:
    """:func:`run_program` one step at a time (a check can compare a step's rows before the
    next step runs)."""
    rng = random.Random(seed)
    for contexts in program:
        way = rng.random()
        if way < 0.1:
            backend.clear_cache()
        asked = [list(c) for c in contexts]
        if way < 0.6:
            yield list(backend.batch_next_token_logprobs_sync(asked))
        else:

            async def calls(asked: list[list[int]] = asked) -> list[Any]:
                return await asyncio.gather(*(backend.next_token_logprobs(c) for c in asked))

            yield asyncio.run(calls())


def alone(backend: Any) -> Callable[[Context], Any]:
    """The oracle: a context's row computed alone, without any cache."""
    if hasattr(backend, "next_token_logprobs_uncached"):
        return lambda c: backend.next_token_logprobs_uncached(list(c))

    def fresh(c: Context) -> Any:
        backend.clear_cache()
        return backend.next_token_logprobs_sync(list(c))

    return fresh
