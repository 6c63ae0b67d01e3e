"""Rows of very different suffix lengths in passes of their own (genlm_hf.passes).

The split is checked against brute force (every partition of a call's rows into passes:
none costs less), and calls mixing long suffixes with short ones (the eager path's, and
the static path's contexts that continue no row) against the uncached model, row for
row, at the bound derived from the arithmetic.
"""

from __future__ import annotations

import random
from itertools import combinations
from typing import Any

import pytest
import torch
from genlm_hf.passes import PASS_COST, pass_groups
from hf_helpers import column_bytes, load_hf, reference

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
        assert after["forward_calls"] - before["forward_calls"] == 2  # 40 x 1 and 3 x 150, not 43 x 150
        assert after["tokens_computed"] - before["tokens_computed"] == 40 + 3 * 150
        assert_tiny_close(got, reference(llm, steps + joining))
    finally:
        llm.close()


# ---------------------------------------------------------------- the resident rows' passes
def _tight(path: str, rows: int, columns: int, **options: Any) -> Any:
    """A static-path backend whose buffers hold one block of ``rows`` x ``columns``."""
    return load_hf(
        path,
        batch_size=rows,
        static_decode="on",
        cache_size=0,
        static_decode_bytes=rows * columns * column_bytes(path),
        **options,
    )


def _uncached(llm: Any, contexts: list[tuple[int, ...]]) -> torch.Tensor:
    return llm._finalize(torch.stack(llm.engine.forward_uncached(contexts)))


def test_resident_new_prompts_beside_short_suffixes_run_in_two_passes(tiny_llama_path: str) -> None:
    """The static path's eager contexts (those that continue no row) split the same way:
    contexts a few tokens past live rows and long new prompts, then every row continued."""
    llm = load_hf(tiny_llama_path, batch_size=64, static_decode="on", cache_size=0)
    try:
        shape = model_shape(llm)
        rng = random.Random(5)
        V = llm.vocab_size
        prompts = [tuple(rng.randrange(3, V) for _ in range(6)) for _ in range(20)]
        llm.batch_next_token_logprobs_sync(prompts)  # 20 live rows
        ahead = [p + tuple(rng.randrange(3, V) for _ in range(3)) for p in prompts]  # 3 past a row
        joining = [tuple(rng.randrange(3, V) for _ in range(150)) for _ in range(3)]
        before = llm.engine.resident.stats()
        got = llm.batch_next_token_logprobs_sync(ahead + joining)
        after = llm.engine.resident.stats()
        # 20 x 3 and 3 x 150 positions, not 23 x 150
        assert after["resident_eager_passes"] - before["resident_eager_passes"] == 2
        assert after["resident_eager"] - before["resident_eager"] == 23
        assert_rows_close(got, _uncached(llm, ahead + joining), shape, what="the split call")
        nxt = [c + (7,) for c in ahead + joining]  # each continues the row its KV went to
        got = llm.batch_next_token_logprobs_sync(nxt)
        assert llm.engine.resident.stats()["rows_resumed"] - after["rows_resumed"] == 23
        assert_rows_close(got, _uncached(llm, nxt), shape, what="the rows continued")
    finally:
        llm.close()


def test_a_later_pass_reads_a_prefix_whose_row_an_earlier_pass_took(tiny_llama_path: str) -> None:
    """One block of two rows, full: a new 3-token prompt takes the row of the live context
    that a context 10 tokens past it forks from. The prompt's pass runs first (shorter) and
    its KV goes into that row before the other pass reads its prefix: the prefix is read
    from the row's KV as placement evicted it, not from the row."""
    llm = _tight(tiny_llama_path, rows=2, columns=16)
    llm.engine.resident.pass_cost = 0  # a pass per suffix length
    try:
        shape = model_shape(llm)
        rng = random.Random(9)
        V = llm.vocab_size
        p1, p2 = (tuple(rng.randrange(3, V) for _ in range(6)) for _ in range(2))
        llm.batch_next_token_logprobs_sync([p1, p2])
        new, ahead = (
            tuple(rng.randrange(3, V) for _ in range(3)),
            p1 + tuple(rng.randrange(3, V) for _ in range(10)),
        )
        before = llm.engine.resident.stats()
        got = llm.batch_next_token_logprobs_sync([new, ahead])
        after = llm.engine.resident.stats()
        assert after["resident_eager_passes"] - before["resident_eager_passes"] == 2
        assert after["resident_flushed"] - before["resident_flushed"] == 2  # both rows taken
        assert_rows_close(got, _uncached(llm, [new, ahead]), shape, what="a prefix from a taken row")
        nxt = [new + (5,), ahead + (5,)]
        got = llm.batch_next_token_logprobs_sync(nxt)
        assert_rows_close(got, _uncached(llm, nxt), shape, what="the rows continued")
    finally:
        llm.close()
