"""Rows of very different suffix lengths in passes of their own (genlm_hf.pass_groups).

The split is checked against brute force (every partition of a call's rows into passes:
none costs less), and calls mixing long suffixes with short ones against the uncached
model, row for row, at the bound derived from the arithmetic. (The prefixes several new
contexts of a call share, run once: test_hf_call_plan.py.)
"""

from __future__ import annotations

import random
from itertools import combinations
from typing import Any

import pytest
import torch
from genlm_hf.pass_groups import PASS_COST, pass_groups
from hf_helpers import load_hf, reference

from genlm_core.testing.tolerance import assert_rows_close, assert_tiny_close, model_shape


def _cost(suffixes: list[int], groups: list[list[int]], pass_cost: int) -> int:
    return sum(pass_cost + len(g) * max(suffixes[i] for i in g) for g in groups)


def _partitions(items: list[int]):
    """Every set partition of ``items`` (brute force: Bell(n) of them)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for k in range(len(rest) + 1):
        for others in combinations(rest, k):
            left = [x for x in rest if x not in others]
            for tail in _partitions(left):
                yield [[first, *others], *tail]


@pytest.mark.parametrize("seed", range(40))
def test_the_split_costs_no_more_than_any_partition(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 7)
    suffixes = [rng.choice([1, 1, 1, 2, 3, rng.randint(1, 400)]) for _ in range(n)]
    pass_cost = rng.choice([0, 5, 50, PASS_COST])
    groups = pass_groups(suffixes, pass_cost)
    assert sorted(i for g in groups for i in g) == list(range(n))  # every row once
    got = _cost(suffixes, groups, pass_cost)
    best = min(_cost(suffixes, p, pass_cost) for p in _partitions(list(range(n))))
    assert got == best, (suffixes, pass_cost, groups)


def test_an_even_call_stays_one_pass_in_its_order() -> None:
    assert pass_groups([1] * 64) == [list(range(64))]
    assert pass_groups([3, 1, 2, 1]) == [[0, 1, 2, 3]]  # padding below the pass cost
    # 7 rows that lost their prefixes among 57 one-token rows: two passes
    groups = pass_groups([400] * 7 + [1] * 57)
    assert groups == [list(range(7, 64)), list(range(7))]


def test_a_mixed_call_runs_in_two_passes_and_matches_the_uncached_model(tiny_llama_path: str) -> None:
    llm = load_hf(tiny_llama_path, cache_size=0, batch_size=64)
    try:
        rng = random.Random(3)
        V = llm.vocab_size
        prompts = [[rng.randrange(3, V) for _ in range(6)] for _ in range(40)]
        llm.batch_next_token_logprobs_sync(prompts)  # their KV in the prefix cache
        steps = [p + [rng.randrange(3, V)] for p in prompts]  # one new token each
        joining = [[rng.randrange(3, V) for _ in range(150)] for _ in range(3)]  # long, new
        before = dict(llm.stats()["engine"])
        got = llm.batch_next_token_logprobs_sync(steps + joining)
        after = llm.stats()["engine"]
        assert after["forward_calls"] - before["forward_calls"] == 1  # one call of the core's
        assert after["pool_passes"] - before["pool_passes"] == 2  # 40 x 1 and 3 x 150, not 43 x 150
        assert after["tokens_computed"] - before["tokens_computed"] == 40 + 3 * 150
        assert_tiny_close(got, reference(llm, steps + joining))
    finally:
        llm.close()


def test_a_mixed_call_on_the_decode_step_splits_too(tiny_llama_path: str) -> None:
    """With the decode step on, a call of contexts a few tokens past kept ones and long
    new prompts splits the same way (each pass eager: no pass is one token a row), and the
    next call, one token a row, is one decode step."""
    llm = load_hf(tiny_llama_path, batch_size=64, static_decode="on", cache_size=0)
    try:
        shape = model_shape(llm)
        rng = random.Random(5)
        V = llm.vocab_size
        prompts = [tuple(rng.randrange(3, V) for _ in range(6)) for _ in range(20)]
        llm.batch_next_token_logprobs_sync(prompts)
        ahead = [p + tuple(rng.randrange(3, V) for _ in range(3)) for p in prompts]  # 3 past a kept one
        joining = [tuple(rng.randrange(3, V) for _ in range(150)) for _ in range(3)]
        before = dict(llm.stats()["engine"])
        got = llm.batch_next_token_logprobs_sync(ahead + joining)
        after = dict(llm.stats()["engine"])
        # 20 x 3 and 3 x 150 positions, not 23 x 150
        assert after["pool_passes"] - before["pool_passes"] == 2
        assert after["tokens_computed"] - before["tokens_computed"] == 20 * 3 + 3 * 150
        assert_rows_close(got, _uncached(llm, ahead + joining), shape, what="the split call")
        nxt = [c + (7,) for c in ahead + joining]
        got = llm.batch_next_token_logprobs_sync(nxt)
        assert llm.stats()["engine"]["static_steps"] - after["static_steps"] == 1
        assert_rows_close(got, _uncached(llm, nxt), shape, what="the rows continued")
    finally:
        llm.close()


def _uncached(llm: Any, contexts: list[tuple[int, ...]]) -> torch.Tensor:
    return llm.rows.finalize(torch.stack(llm.engine.forward_uncached(contexts)))
