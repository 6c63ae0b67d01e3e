"""Random programs over the KV pool (genlm_hf.pool), every row against the uncached model
(one full pass per context) at the bound derived from the arithmetic.

The programs mix what programs do to their contexts: a token a step (SIS), forks of one
context into several (a beam's candidates, SMC's resampled particles: pages shared, the
last one copied on write), jumps of many tokens (a new tokenisation), backing up and
diverging (a fork shorter than the kept context), contexts re-asked, new prompts of one
to 120 tokens; with the decode step on and off, pools from a few pages up (kept contexts
released under pressure, calls split in halves), no reuse at all, and eager passes split
at any cost (:attr:`HFEngine.pass_cost` 0: a pass per suffix length). A program that
fails names its seed and its options.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from hf_helpers import column_bytes, load_hf

from genlm_core.testing.tolerance import assert_rows_close, model_shape

Context = tuple[int, ...]


def _next(rng: random.Random, live: list[Context], before: list[Context], token: Any) -> list[Context]:
    """The contexts of the program's next step."""
    out: list[Context] = []
    for c in live:
        r = rng.random()
        if r < 0.55:  # one token
            out.append(c + (token(),))
        elif r < 0.75:  # forked
            out += [c + (token(),) for _ in range(rng.randint(2, 4))]
        elif r < 0.85:  # a jump
            out.append(c + tuple(token() for _ in range(rng.randint(2, 20))))
        elif r < 0.9 and len(c) > 2:  # backed up, then diverging
            k = rng.randint(1, min(len(c) - 1, 10))
            out.append(c[:-k] + tuple(token() for _ in range(rng.randint(1, 4))))
        elif r < 0.95 and before:  # a context of the step before, asked again
            out.append(rng.choice(before))
        # else: the context dies
    if rng.random() < 0.2:  # a new prompt
        out.append(tuple(token() for _ in range(rng.randint(1, 120))))
    rng.shuffle(out)
    out = [c[-200:] for c in out][: rng.randint(1, 40)]
    return out or [tuple(token() for _ in range(rng.randint(1, 8)))]


@pytest.mark.parametrize("seed", range(12))
def test_fuzzed_programs_match_the_uncached_model(tiny_llama_path: str, seed: int) -> None:
    per_column = column_bytes(tiny_llama_path)
    rng = random.Random(seed)
    options: dict[str, Any] = {
        "batch_size": rng.choice([2, 3, 4, 8, 16]),
        "static_decode": rng.choice(["on", "off"]),
        "cache_size": 0,
        "kv_cache_bytes": rng.choice([0, 6, 12, 24, 64, None]),
    }
    if options["kv_cache_bytes"]:
        options["kv_cache_bytes"] *= 16 * per_column  # pages of 16 columns
    llm = load_hf(tiny_llama_path, **options)
    try:
        llm.engine.pass_cost = rng.choice([0, 0, 8, 64, 512])
        shape = model_shape(llm)

        def token() -> int:
            return rng.randrange(3, llm.vocab_size)

        live = [tuple(token() for _ in range(rng.randint(1, 12))) for _ in range(rng.randint(1, 10))]
        before: list[Context] = []
        for step in range(rng.randint(5, 25)):
            if step:
                before, live = live, _next(rng, live, before, token)
            live = list(dict.fromkeys(live))
            got = llm.batch_next_token_logprobs_sync(live)
            ref = llm.rows.finalize(torch.stack(llm.engine.forward_uncached(live)))
            assert_rows_close(got, ref, shape, what=f"seed {seed}, step {step} ({options})")
        pool = llm.engine.pool
        bound = options["kv_cache_bytes"]
        if bound:  # the bound held (a context longer than it holds is refused)
            assert pool.nbytes <= bound
        llm.clear_cache()
        assert pool.pages_in_use == 0  # every page went back: no reference leaked
    finally:
        llm.close()
