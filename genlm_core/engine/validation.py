"""Validation of token-id contexts, shared by every backend."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from genlm_core.engine.contexts import Context

__all__ = ["RecentContexts", "validate_context"]

#: the element types a context of plain ints has (``bool`` is not among them)
_ALL_INT = frozenset({int})


def _as_int_tuple(token_ids: Any) -> Context:
    if isinstance(token_ids, tuple) or isinstance(token_ids, list):
        seq = token_ids
    elif isinstance(token_ids, (str, bytes)):
        raise ValueError(
            f"token_ids must be a sequence of integer token ids, got {type(token_ids).__name__}; "
            "encode text with the backend's tokenizer first (llm.tokenizer.encode(text))"
        )
    elif hasattr(token_ids, "tolist") and hasattr(token_ids, "dtype"):  # numpy / torch / mlx
        kind = str(token_ids.dtype)
        if "int" not in kind or "bool" in kind:
            raise ValueError(f"token_ids must hold integers, got an array of dtype {kind}")
        if getattr(token_ids, "ndim", 1) != 1:
            raise ValueError(
                f"token_ids must be 1-D, got shape {tuple(token_ids.shape)}; "
                "use batch_next_token_logprobs for several contexts"
            )
        seq = token_ids.tolist()
    elif isinstance(token_ids, Sequence):
        seq = list(token_ids)
    else:
        raise ValueError(f"token_ids must be a sequence of integer token ids, got {type(token_ids).__name__}")
    if _ALL_INT.issuperset(map(type, seq)):  # the common case, at C speed (a context is
        return seq if type(seq) is Context else Context(seq)  # validated on every call, whole)
    for i, t in enumerate(seq):
        if type(t) is not int:
            if isinstance(t, bool) or not hasattr(t, "__index__"):
                raise ValueError(f"token_ids[{i}] = {t!r} is not an integer token id ({type(t).__name__})")
            seq = [int(x.__index__()) if not isinstance(x, bool) else _bad_bool(j) for j, x in enumerate(seq)]
            break
    return Context(seq)


#: the shortest context whose range check goes through :class:`RecentContexts` (below it
#: ``min`` and ``max`` cost less than a slice, a hash and a lookup)
_RECENT_FROM = 32


class RecentContexts:
    """The contexts one backend validated lately, at most ``size`` (the oldest dropped
    first), so that a context one token longer than one of them - a particle's next call -
    has only its new id's range checked: its other ids equal a validated context's.

    Validating a context reads it three times (the ids' types, ``min``, ``max``: 32 ns a
    token, 2 ms a step for 64 rows of 1,000 tokens); with this the range check is a slice,
    a hash and a comparison (~6 ns a token). The types are still checked whole: ``5.0``
    equals ``5`` in a tuple comparison. Safe to share between threads (a lost race only
    drops a context early)."""

    def __init__(self, size: int = 2048) -> None:
        self.size = max(1, int(size))
        self._seen: dict[Context, None] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def known_parent(self, ctx: Context) -> bool:
        """Whether ``ctx`` less its last id was validated lately (long contexts only)."""
        return len(ctx) > _RECENT_FROM and ctx[:-1] in self._seen

    def add(self, ctx: Context) -> None:
        seen = self._seen
        seen[ctx] = None
        if len(seen) > self.size:
            try:
                del seen[next(iter(seen))]
            except (StopIteration, KeyError, RuntimeError):  # another thread changed it
                pass

    def clear(self) -> None:
        self._seen.clear()


def _bad_bool(i: int) -> int:
    raise ValueError(f"token_ids[{i}] is a bool, not an integer token id")


def validate_context(
    token_ids: Any,
    vocab_size: int,
    max_length: int | None = None,
    allow_empty: bool = False,
    recent: RecentContexts | None = None,
    limit_error: Callable[[int], str | None] | None = None,
) -> Context:
    """Check a context and return it as a :class:`Context` (a tuple of ints that keeps its
    hash), or raise a clear ValueError. ``recent``: the contexts validated lately against
    the same ``vocab_size`` (:class:`RecentContexts`); one that extends one of them by a
    token has only that token's range checked, and a valid context joins them.
    ``limit_error(tokens)``: the engine's sentence for a context over ``max_length`` when
    its own setting is what bounds it (a KV budget: the option and the size it needs), or
    None for the model's window."""
    ctx = _as_int_tuple(token_ids)
    if not ctx and not allow_empty:
        raise ValueError(
            "token_ids is empty: a next-token distribution needs at least one context token "
            "(start with the tokenizer's BOS/EOS token id if you have no prompt)"
        )
    if ctx:
        if recent is not None and recent.known_parent(ctx):
            lo = hi = ctx[-1]
        else:
            lo, hi = min(ctx), max(ctx)
        if lo < 0:
            raise ValueError(f"token_ids holds a negative id ({lo}); ids run from 0 to {vocab_size - 1}")
        if hi >= vocab_size:
            raise ValueError(
                f"token_ids holds id {hi}, outside the vocabulary (size {vocab_size}, ids 0..{vocab_size - 1})"
            )
    if max_length is not None and len(ctx) > max_length:
        why = limit_error(len(ctx)) if limit_error is not None else None
        if why:
            raise ValueError(f"context has {len(ctx)} tokens but at most {max_length} fit: {why}")
        raise ValueError(
            f"context has {len(ctx)} tokens but the model allows at most {max_length}; "
            "truncate the context (keep its last tokens) or use a model with a longer window"
        )
    if recent is not None and len(ctx) >= _RECENT_FROM:
        recent.add(ctx)
    return ctx
