"""Which rows a call runs, in which round, and which contexts are read off another's row.

A call asks for the next-token logits of distinct contexts. Each context resumes from the
deepest prefix the prefix cache keeps (its ``depth``) and the model runs the tokens past
it. Two shapes of call would otherwise compute tokens more than once:

* **nested contexts**: a context ``X`` that is a proper prefix of another context ``Y`` of
  the same call (scoring a continuation: ``P + c[:1]``, ``P + c[:2]``, ...). ``Y``'s row
  runs every position of ``X`` already, so ``X`` is *read off* ``Y``'s row (its logits at
  position ``len(X) - 1``, its KV the first ``len(X)`` columns of ``Y``'s) whenever ``Y``
  resumes before ``X``'s last token. A chain ``X ⊂ Y ⊂ Z`` is read off ``Z``'s row.
* **siblings**: contexts that share a long uncached prefix ``B`` (a new prompt with
  several continuations). ``B`` is a *branch point*: it runs first, once, and is kept; the
  contexts past it run in the next round and resume from it.

:func:`plan_round` plans one round from the call's pending contexts and their depths: the
rows to run now (with the contexts read off each) and the contexts deferred to a later
round (those below a branch point that runs now). A call runs rounds until nothing is
pending: one round per level of branch points (a new prompt with siblings: two rounds),
never one per token, and no recursion. Every token past the kept depths is computed once,
except that siblings whose shared uncached prefix is shorter than :data:`MIN_COMMON` each
compute it (a separate round costs more than those few tokens).

The only prefixes that matter for branch points are the longest common prefixes of
contexts adjacent in sorted order: any two contexts' common prefix is the shortest of
those between them. Comparisons are slices of tuples (they run in C).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["MIN_COMMON", "PlannedRow", "RoundPlan", "longest_common_prefix", "plan_round"]

#: the fewest uncached tokens siblings must share for their common prefix to run first
#: as a branch point (below it each sibling computes the shared tokens itself)
MIN_COMMON = 32

Context = tuple[int, ...]


@dataclass
class PlannedRow:
    """A row of a round: ``ctx`` runs past its kept depth; ``read_off`` are the contexts
    of the call whose logits are read at their last position in this row (proper prefixes
    of ``ctx``, shortest first); ``wanted``: whether the call asked for ``ctx`` itself (a
    branch point is run for its KV only)."""

    ctx: Context
    #: the kept depth it was planned from (the tokens past it: its pass's share)
    depth: int = 0
    read_off: list[Context] = field(default_factory=list)
    wanted: bool = True


@dataclass
class RoundPlan:
    """One round: ``rows`` to run now, ``deferred`` contexts for a later round."""

    rows: list[PlannedRow]
    deferred: list[Context]


def longest_common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, known to be at least
    ``start`` (binary search over slice comparisons, which run in C)."""
    lo, hi = start, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _extends(longer: Context, shorter: Context) -> bool:
    return len(longer) > len(shorter) and longer[: len(shorter)] == shorter


def plan_round(
    contexts: Sequence[Context],
    depths: Sequence[int],
    min_common: int | None = MIN_COMMON,
    read_off: bool = True,
) -> RoundPlan:
    """One round of a call over distinct ``contexts`` whose kept depths are ``depths``
    (see the module doc). ``min_common=None``: no branch points (every pending context
    runs now; a call whose branch points the prefix cache keeps losing ends with it).
    ``read_off=False``: an engine that hands back each row's last position only; a
    nested context runs as a row of its own.
    Rows come in the call's order (branch points first); a call whose every context runs
    one new token (a step) is planned without sorting."""
    if all(len(c) - d <= 1 for c, d in zip(contexts, depths)):
        # one token each: no context runs another's position, and none shares new tokens
        return RoundPlan([PlannedRow(c, d) for c, d in zip(contexts, depths)], [])
    depth = dict(zip(contexts, depths))
    kept = dict(depth)
    branches: set[Context] = set()
    if min_common is not None:
        # two contexts share new tokens only when they resume from the same kept prefix (one
        # kept prefix of either, shorter than what they share, is the other's too): sorted by
        # (depth, context), such contexts lie together, and a branch point is the common
        # prefix of neighbours of one depth that are not nested, min_common past that depth
        long = sorted((d, c) for c, d in depth.items() if len(c) - d > min_common)
        for (da, a), (db, b) in zip(long, long[1:]):
            if da != db or _extends(b, a):
                continue
            k = longest_common_prefix(a, b, 0)
            if k - da >= min_common:
                branches.add(a[:k])
                kept.setdefault(a[:k], da)
    # a context or branch point waits for a later round when a branch point below it is
    # longer than its kept depth (it resumes from that branch point once it is kept)
    now: list[Context] = []
    deferred: list[Context] = []
    stack: list[Context] = []  # the branch points that are proper prefixes of the current node
    for x in sorted(kept):
        while stack and not _extends(x, stack[-1]):
            stack.pop()
        if any(len(b) > kept[x] for b in stack):
            if x in depth:
                deferred.append(x)
        else:
            now.append(x)
        if x in branches:
            stack.append(x)
    # nested contexts of this round: read off the row nearest above them in their chain (in
    # sorted order a node's extensions follow it directly), when that row runs their last
    # position (kept depths only grow along a chain: if the nearest row resumes past it, so
    # does every row above it, and the context runs as a row of its own)
    owner = list(range(len(now)))
    for i in range(len(now) - 2, -1, -1) if read_off else ():
        if _extends(now[i + 1], now[i]):
            o = owner[i + 1]
            if kept[now[o]] <= len(now[i]) - 1:
                owner[i] = o
    rows = {x: PlannedRow(x, kept[x], wanted=x in depth) for i, x in enumerate(now) if owner[i] == i}
    for i, x in enumerate(now):
        if owner[i] != i:
            rows[now[owner[i]]].read_off.append(x)
    ordered = [rows[b] for b in sorted(branches, key=len) if b in rows and b not in depth]
    ordered += [rows[c] for c in contexts if c in rows]
    waiting = set(deferred)
    return RoundPlan(ordered, [c for c in contexts if c in waiting])
