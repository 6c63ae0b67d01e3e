"""A call's rounds (genlm_core.engine.call_plan) against brute force.

A small simulator runs a whole call the way the engine does: each round is planned from
the contexts still pending and the depths a prefix cache (a set of kept contexts) gives
them; every row "computes" the tokens past its depth and is kept, with the contexts read
off it. The oracle is the call's prefix tree counted token by token: every distinct
prefix of the call's contexts deeper than what is kept is a token that must be computed
once, and no other token need be. Without a threshold (``min_common=1``) the plan must
compute exactly that minimum; with the engine's threshold at most ``MIN_COMMON - 1``
tokens more per row. Rounds are bounded by the levels of branching, never by tokens.
"""

from __future__ import annotations

import random

import pytest

from genlm_core.engine.call_plan import MIN_COMMON, longest_common_prefix, plan_round

Context = tuple[int, ...]


def _deepest(kept: set[Context], ctx: Context) -> int:
    """The deepest kept proper prefix of ``ctx`` (the prefix cache's lookup, brute force)."""
    return max((len(k) for k in kept if len(k) < len(ctx) and ctx[: len(k)] == k), default=0)


def simulate(
    contexts: list[Context], kept: set[Context], min_common: int
) -> tuple[int, int, dict[Context, int]]:
    """(tokens computed, rounds, the row length each context's logits were read at)."""
    pending, computed, rounds, answered = list(contexts), 0, 0, {}
    while pending:
        rounds += 1
        assert rounds <= len(contexts) + 2, "no progress"
        depths = [_deepest(kept, c) for c in pending]
        plan = plan_round(pending, depths, min_common)
        assert plan.rows, "a round without rows"
        late = []
        for row in plan.rows:  # in order, each looked up when it runs (as the engine's passes)
            depth = _deepest(kept, row.ctx)
            assert depth >= row.depth  # a row run earlier in the round may have kept a prefix
            computed += len(row.ctx) - depth
            for c in row.read_off:  # read at a position the row runs, else a later round's
                assert row.ctx[: len(c)] == c and len(c) < len(row.ctx)
                if len(c) <= depth:
                    late.append(c)
                    continue
                assert c not in answered
                answered[c] = len(c)
                kept.add(c)
            if row.wanted:
                assert row.ctx not in answered
                answered[row.ctx] = len(row.ctx)
            else:  # a branch point: a proper prefix of two pending contexts, not asked for
                assert row.ctx not in contexts and sum(p[: len(row.ctx)] == row.ctx for p in pending) >= 2
            kept.add(row.ctx)
        pending = plan.deferred + late
    assert answered == {c: len(c) for c in contexts}  # every context once, at its last position
    return computed, rounds, answered


def minimum(contexts: list[Context], kept: set[Context]) -> int:
    """The distinct prefixes of the contexts past the deepest kept prefix of each."""
    need = set()
    for c in contexts:
        for n in range(_deepest(kept, c) + 1, len(c) + 1):
            need.add(c[:n])
    return len(need)


def _tree(rng: random.Random, n: int, alphabet: int) -> list[Context]:
    """Contexts that fork off each other at random depths (forks of forks), with some
    nested in others (a context and its extensions) and some repeated lengths."""
    out: list[Context] = [tuple(rng.randrange(alphabet) for _ in range(rng.randint(1, 60)))]
    for _ in range(n - 1):
        base = rng.choice(out)
        cut = rng.randint(0, len(base))
        if rng.random() < 0.25 and cut:  # a prefix of another context
            out.append(base[:cut])
        else:
            out.append(base[:cut] + tuple(rng.randrange(alphabet) for _ in range(rng.randint(1, 60))))
    return list(dict.fromkeys(out))


@pytest.mark.parametrize("seed", range(60))
def test_without_a_threshold_every_token_is_computed_once(seed: int) -> None:
    rng = random.Random(seed)
    contexts = _tree(rng, rng.randint(1, 12), rng.choice([2, 3, 50]))
    kept: set[Context] = set()
    if rng.random() < 0.5:  # some prefixes kept already (a prompt, earlier steps)
        for c in rng.sample(contexts, k=min(3, len(contexts))):
            kept.add(c[: rng.randint(0, len(c))])
        kept.discard(())
    want = minimum(contexts, kept)
    computed, rounds, _ = simulate(contexts, set(kept), min_common=1)
    assert computed == want


@pytest.mark.parametrize("seed", range(60))
def test_with_the_engines_threshold_at_most_its_share_more(seed: int) -> None:
    rng = random.Random(1000 + seed)
    contexts = _tree(rng, rng.randint(1, 12), rng.choice([2, 50]))
    want = minimum(contexts, set())
    computed, _, _ = simulate(contexts, set(), min_common=MIN_COMMON)
    assert want <= computed <= want + (MIN_COMMON - 1) * len(contexts)


def test_nested_contexts_are_one_row_and_one_round() -> None:
    """A context and its extensions (a continuation scored token by token after a prompt):
    one row, read off at every length, one round; the shape that took a pass per token."""
    prompt = tuple(range(300))
    chain = [prompt + tuple(range(1000, 1000 + k)) for k in range(1, 32)]
    computed, rounds, _ = simulate([prompt, *chain], set(), MIN_COMMON)
    assert (computed, rounds) == (331, 1)
    plan = plan_round([prompt[:-1], prompt], [0, 0])  # 299 and 300 tokens
    assert len(plan.rows) == 1 and plan.rows[0].read_off == [prompt[:-1]] and not plan.deferred


def test_siblings_of_a_long_new_prompt_take_two_rounds() -> None:
    for n in (940, 997, 1100, 4000):
        p = tuple(7 + i % 500 for i in range(n))
        contexts = [p + (1, 2), p + (1, 3), p + (4, 5)]
        computed, rounds, _ = simulate(contexts, set(), MIN_COMMON)
        assert rounds == 2 and computed == minimum(contexts, set()) + 1  # (1,) twice: below the threshold


def test_levels_of_branching_bound_the_rounds() -> None:
    """A prompt, k continuations of 500 tokens, each with two of 300: three rounds, every
    token once (each common prefix is at least MIN_COMMON past what is kept)."""
    rng = random.Random(4)
    prompt = tuple(rng.randrange(99) for _ in range(1000))
    contexts = []
    for _ in range(4):
        mid = prompt + tuple(rng.randrange(99) for _ in range(500))
        contexts += [mid + tuple(rng.randrange(99) for _ in range(300)) for _ in range(2)]
    computed, rounds, _ = simulate(contexts, set(), MIN_COMMON)
    assert rounds == 3 and computed == minimum(contexts, set())


@pytest.mark.parametrize("seed", range(30))
def test_longest_common_prefix_against_a_token_walk(seed: int) -> None:
    rng = random.Random(seed)
    a = tuple(rng.randrange(3) for _ in range(rng.randint(0, 40)))
    b = a[: rng.randint(0, len(a))] + tuple(rng.randrange(3) for _ in range(rng.randint(0, 40)))
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    assert longest_common_prefix(a, b) == k
