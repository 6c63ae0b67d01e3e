"""A validated context is a :class:`~genlm_core.engine.contexts.Context`: a tuple of its
token ids that keeps its hash. Everything that looked contexts up as tuples must find
them the same way: equal to the tuple, the same hash, in dicts either way round, through
pickle and copies, and through a backend's output cache whatever form the caller used."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import genlm_core
from genlm_core.engine.contexts import Context
from genlm_core.engine.validation import validate_context

ids = st.lists(st.integers(min_value=0, max_value=999), max_size=300)


@given(ids)
def test_a_context_is_its_tuple(values: list[int]) -> None:
    t = tuple(values)
    ctx = Context(values)
    assert ctx == t and t == ctx and hash(ctx) == hash(t)
    assert list(ctx) == values and len(ctx) == len(values)
    assert {t: 1}[ctx] == 1 and {ctx: 2}[t] == 2  # either finds the other
    assert ctx in {t} and t in {ctx}
    assert type(ctx[:-1]) is tuple and ctx[:-1] == t[:-1]  # slices are plain tuples
    for again in (pickle.loads(pickle.dumps(ctx)), copy.copy(ctx), copy.deepcopy(ctx)):
        assert again == t and hash(again) == hash(t)


@given(ids.filter(bool))
def test_validation_hands_on_a_context_of_the_same_ids(values: list[int]) -> None:
    for given_as in (values, tuple(values), np.array(values, dtype=np.int64), Context(values)):
        ctx = validate_context(given_as, 1000)
        assert type(ctx) is Context
        assert ctx == tuple(values) and hash(ctx) == hash(tuple(values))


def test_a_context_is_checked_again_against_each_vocabulary() -> None:
    ctx = validate_context([3, 7, 900], 1000)
    assert validate_context(ctx, 1000) is ctx  # no copy of one already made
    with pytest.raises(ValueError, match="outside the vocabulary"):
        validate_context(ctx, 500)  # another backend's, smaller vocabulary
    with pytest.raises(ValueError, match="at most 2"):
        validate_context(ctx, 1000, max_length=2)


def test_the_output_cache_finds_a_context_whatever_form_it_came_in() -> None:
    """A list, a tuple, a numpy array and a Context of the same ids are one cache entry,
    and each gets the same row (the first call's, computed once)."""
    llm = genlm_core.load("mock")
    try:
        first = llm.next_token_logprobs_sync([4, 5, 6])
        for form in ((4, 5, 6), np.array([4, 5, 6]), Context([4, 5, 6])):
            assert llm.next_token_logprobs_sync(form).equal(first)
        cache = llm.stats()["output_cache"]
        assert (cache["misses"], cache["hits"], cache["entries"]) == (1, 3, 1)
    finally:
        llm.close()


def _outcome(ctx: list[Any], vocab: int, **kw: Any) -> Any:
    try:
        return ("ok", validate_context(ctx, vocab, max_length=80, **kw))
    except ValueError as e:
        return ("error", str(e))


@given(
    st.lists(
        st.tuples(
            st.integers(0, 40),  # which earlier context to extend (or a fresh one)
            st.sampled_from(["ok", "ok", "ok", "big", "negative", "float", "bool", "np"]),  # the new id
            st.integers(0, 3),  # where a bad id goes: 0 the end, else somewhere before it
        ),
        max_size=60,
    ),
    st.integers(28, 40),
)
def test_recent_contexts_change_no_verdict(steps: list[tuple[int, str, int]], start: int) -> None:
    """Validation with the recent contexts (only a known context's new id is range-checked)
    against validation without: the same context or the same error, for particles that
    extend earlier contexts by good and bad ids (out of range, negative, a float, a bool, a
    numpy int), also placed before the last position (where only the type check sees them)."""
    from genlm_core.engine.validation import RecentContexts

    vocab = 1000
    recent = RecentContexts(size=8)
    made: list[list[Any]] = [list(range(start))]
    for pick, kind, where in steps:
        base = list(made[pick % len(made)])
        new: Any = {
            "ok": 7,
            "big": vocab,
            "negative": -1,
            "float": 7.0,
            "bool": True,
            "np": np.int64(9),
        }[kind]
        ctx = base + [new] if where == 0 else base[:-where] + [new] + base[-where:] + [5]
        want = _outcome(ctx, vocab)
        got = _outcome(ctx, vocab, recent=recent)
        assert got == want, (ctx, got, want)
        assert len(recent) <= 8
        if want[0] == "ok":
            made.append(list(want[1]))


def test_a_backend_checks_a_particles_new_id_only_and_still_refuses_a_bad_one() -> None:
    llm = genlm_core.load("mock")
    try:
        prompt = list(range(1, 60))
        llm.next_token_logprobs_sync(prompt)
        assert (
            tuple(prompt[:-1]) not in llm.context_checks.recent._seen
            and tuple(prompt) in llm.context_checks.recent._seen
        )
        llm.next_token_logprobs_sync(prompt + [3])
        for bad, match in (
            (llm.vocab_size, "outside the vocabulary"),
            (-2, "negative"),
            (2.0, "not an integer"),
        ):
            with pytest.raises(ValueError, match=match):
                llm.next_token_logprobs_sync(prompt + [3, bad])
    finally:
        llm.close()
