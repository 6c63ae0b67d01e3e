"""Contexts: the one :class:`Context` type, and the one way rows of contexts are computed.

A context is a tuple of token ids (validated by :mod:`~genlm_core.engine.validation`).
Whoever computes the rows of several contexts at once - a sync batch call, the core's
decode step of a burst, an engine's decode batches - computes each distinct context
once, in order of first appearance, in batches of ``batch_size``, and hands every
context its row: :func:`run_distinct`. One function, so a burst and a step loop make
the same engine calls with the same contexts in the same order (the same numbers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["Context", "run_distinct"]


class Context(tuple):
    """A context as validation hands it on: the tuple of its token ids, hashed once
    (:func:`~genlm_core.engine.validation.validate_context` makes them; every engine and
    the core take this type, and a plain tuple of ints - a slice of one - works alike).

    A call looks its context up about ten times (the output cache, the batcher's queue,
    an engine's KV index), and a tuple hashes all its items again each time: 2.3 us for
    1,000 tokens, so 64 rows of 1,000 tokens spent about 1.6 ms of host time a step in
    hashing alone (a GPU's whole decode step of 64 rows: 5-8 ms). A ``Context`` hashes its
    ids when it is made and keeps the hash (65 ns a lookup at any length). It is a tuple otherwise: equal to the tuple
    of its ids, with the same hash, so either finds the other in a dict; slices are plain
    tuples. It pickles as a plain ``Context`` of its ids (the hash is made again)."""

    def __new__(cls, ids: Any = ()) -> "Context":
        self = tuple.__new__(cls, ids)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        return (Context, (tuple(self),))


R = TypeVar("R")


def run_distinct(contexts: Sequence[Context], batch_size: int, run: Callable[[list[list[Context]]], R]) -> R:
    """``run`` over the distinct ``contexts``, its results re-expanded to every context.

    ``run(chunks)`` gets the distinct contexts in order of first appearance, in chunks of
    ``batch_size`` (the batches a step loop's call makes), and returns one result per
    distinct context, in that order: a list, or a tensor whose rows are the results.
    Returns the same kind with one result per context of ``contexts`` (a repeated
    context gets its first occurrence's result); ``run``'s own object when the contexts
    are distinct (no copy)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"run_distinct: batch_size must be a positive int, got {batch_size!r}")
    unique = list(dict.fromkeys(contexts))
    results: Any = run([unique[i : i + batch_size] for i in range(0, len(unique), batch_size)])
    if len(results) != len(unique):
        raise ValueError(
            f"run_distinct: {len(results)} results for {len(unique)} distinct contexts; run(chunks) "
            "returns one result per distinct context, in order"
        )
    if len(unique) == len(contexts):
        return results
    where = {c: i for i, c in enumerate(unique)}
    index = [where[c] for c in contexts]
    if isinstance(results, list | tuple):
        return [results[i] for i in index]  # type: ignore[return-value]
    return results[index]
