"""Resident rows: which context of an ordinary call continues which live engine row.

A program's particles call ``next_token_logprobs`` once a step, each on its context of the
step before plus one token. An engine that can keep a row's state alive between calls (a
vLLM streaming-input session, a KV slot) runs only that token when it knows which live
row the new context extends. :class:`ResidentRows` is that bookkeeping, engine-free: the
engine supplies the row state (an opaque payload) and runs the rows; this class decides,
for the distinct contexts of a call,

* which live row each context continues: the row of the same ``key`` (the adapter in
  use: a row computed under another adapter never continues) holding the context's
  longest proper prefix, at most ``max_gap`` tokens shorter; each row continues one
  context per call (two particles that shared a row and now differ: the first continues
  it, the other starts afresh);
* which contexts start afresh (the engine runs them from their prompt: its prefix cache
  supplies what it holds; an engine that can copy a live row's KV forks the row holding
  the longest prefix, ``Placement.source``) and which of those stay resident after the call: rows live at
  once are at most ``capacity`` (the engine's bound of the call, at most ``max_rows``),
  the least recently used rows no context continues are evicted first to make room
  (never a row used after the least recently used row the call continues: another
  particle of the same step, split off by the batcher), and fresh contexts past the
  bound run once and end;
* which rows have been idle longer than ``idle_s`` (:meth:`expire`, checked at every
  call: an engine that gets no calls keeps its rows until the next one).

Identical contexts in a call share one row (pass distinct contexts; the engine maps the
duplicates). A row's context is the context whose output the engine returned last, so a
later call on exactly that context (no new token to run) starts afresh.

What the rows hold (``token_budget``): without ``block_size`` every row's context counts in
full; with it (an engine whose rows share the KV blocks of a common prefix, vLLM's paged
cache) the rows hold the distinct full ``block_size``-token blocks of their contexts (a
prompt 64 particles extend counts once) and one partial block per row, in tokens.

Counters (:meth:`stats`): rows resumed (a context continued a live row), restarted (a
context ran from its prompt), evicted (by the bound), expired (idle), and the live rows.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from genlm_core.engine.contexts import Context

__all__ = ["Placement", "ResidentRow", "ResidentRows"]


@dataclass(eq=False)
class ResidentRow:
    """A live engine row: ``context`` is what its state holds, ``state`` the engine's
    payload, ``key`` what it was computed under (the adapter)."""

    context: Context
    state: Any
    key: Hashable
    last_used: float = 0.0
    #: keys of the context's full KV blocks (``ResidentRows(block_size=...)``), else ()
    blocks: tuple[int, ...] = ()
    #: the context it held before its last continuation (its state still holds it)
    previous: Context = ()


@dataclass
class Placement:
    """One context of a call: the live ``row`` it continues (None: it starts afresh) and
    whether it is resident after the call (``keep``)."""

    context: Context
    row: ResidentRow | None
    keep: bool
    #: tokens of ``context`` the row holds (0: none)
    depth: int = 0
    #: keys of the context's full KV blocks (``ResidentRows(block_size=...)``), else ()
    blocks: tuple[int, ...] = ()
    #: a context that starts afresh: a live row (of the same key, live through the call)
    #: whose state holds the context's first :attr:`source_depth` tokens, its longest
    #: proper prefix a row holds or held before its last step, at most ``max_gap`` tokens
    #: shorter: an engine that can copy KV forks that state
    source: ResidentRow | None = None
    source_depth: int = 0

    @property
    def new_tokens(self) -> Context:
        """The tokens the engine runs for it."""
        return self.context[self.depth :]


@dataclass
class Plan:
    """A call's placements (in the order of its contexts) and the rows evicted to make
    room (the engine ends them)."""

    placements: list[Placement]
    evicted: list[ResidentRow] = field(default_factory=list)


def block_keys(context: Context, block_size: int, known: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Keys of the full ``block_size``-token blocks of ``context``, each naming the block and
    every token before it (chained, as a paged KV cache's prefix hashes): two contexts share
    block ``j`` exactly when they share its first ``(j + 1) * block_size`` tokens. ``known``:
    the keys of a prefix of ``context`` (a row it extends), reused."""
    keys = list(known)
    last = keys[-1] if keys else 0
    for start in range(len(keys) * block_size, len(context) - block_size + 1, block_size):
        last = hash((last, context[start : start + block_size]))
        keys.append(last)
    return tuple(keys)


class _Held:
    """What a set of rows holds, in tokens: their contexts' lengths summed, or (``block_size``)
    their distinct full blocks plus one partial block per row, times the block size."""

    def __init__(self, block_size: int | None) -> None:
        self.block_size = block_size
        self.count: Counter[int] = Counter()
        self.units = 0  # tokens, or blocks

    def _partial(self, context: Context) -> int:
        return int(len(context) % self.block_size != 0) if self.block_size else len(context)

    @property
    def tokens(self) -> int:
        return self.units * (self.block_size or 1)

    def cost(self, context: Context, blocks: tuple[int, ...]) -> int:
        """Tokens adding a row of ``context`` would add."""
        new = sum(1 for k in set(blocks) if k not in self.count)
        return (new + self._partial(context)) * (self.block_size or 1)

    def add(self, context: Context, blocks: tuple[int, ...]) -> None:
        for k in blocks:
            if not self.count[k]:
                self.units += 1
            self.count[k] += 1
        self.units += self._partial(context)

    def remove(self, context: Context, blocks: tuple[int, ...]) -> None:
        for k in blocks:
            self.count[k] -= 1
            if not self.count[k]:
                del self.count[k]
                self.units -= 1
        self.units -= self._partial(context)


class ResidentRows:
    """The live rows of one engine, least recently used first (see the module doc)."""

    def __init__(
        self,
        max_rows: int,
        idle_s: float | None = None,
        *,
        max_gap: int = 16,
        clock: Callable[[], float] = time.monotonic,
        block_size: int | None = None,
    ) -> None:
        self.max_rows = max(0, int(max_rows))
        #: the engine's KV block: rows share the full blocks of common prefixes (None: every
        #: row holds its whole context; see the module doc)
        self.block_size = int(block_size) if block_size else None
        self.idle_s = idle_s
        self.max_gap = max(1, int(max_gap))
        self.clock = clock
        #: live rows by context, least recently used first
        self.rows: OrderedDict[Context, ResidentRow] = OrderedDict()
        self.resumed = 0
        self.restarted = 0
        self.evicted = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ one call
    def expire(self) -> list[ResidentRow]:
        """Remove and return the rows idle longer than ``idle_s``."""
        if self.idle_s is None or not self.rows:
            return []
        cutoff = self.clock() - self.idle_s
        old = [c for c, r in self.rows.items() if r.last_used < cutoff]
        self.expired += len(old)
        return [self.rows.pop(c) for c in old]

    def plan(
        self,
        contexts: Sequence[Context],
        key: Hashable,
        capacity: int | None = None,
        token_budget: int | None = None,
    ) -> Plan:
        """Place the distinct ``contexts`` of a call (see the module doc). Continued rows
        leave the index until :meth:`commit`; evicted rows leave it for good. ``capacity``:
        the most rows live after the call (None: ``max_rows``); ``token_budget``: the most
        tokens they hold (None: no bound; continued rows count, whatever it is)."""
        cap = self.max_rows if capacity is None else max(0, min(capacity, self.max_rows))
        placements = []
        for ctx in contexts:
            row = self._parent(ctx, key)
            if row is not None:
                del self.rows[row.context]
            p = Placement(ctx, row, row is not None, len(row.context) if row else 0)
            if token_budget is not None and self.block_size:
                p.blocks = block_keys(ctx, self.block_size, row.blocks if row is not None else ())
            placements.append(p)
        continued = sum(p.row is not None for p in placements)
        fresh = [p for p in placements if p.row is None]
        # a context a live row holds exactly (no new token to run over it): replaced
        evicted = [self.rows.pop(p.context) for p in placements if p.context in self.rows]
        room = max(0, cap - continued)  # rows for the fresh contexts and the idle ones
        # idle rows used since the least recently used row this call continues are the other
        # particles of its step (a step the batcher splits into several calls): a fresh
        # context does not end them, or each would restart at its own call and end another's
        # row in turn (LRU thrash: every row restarting, every step)
        floor = min((p.row.last_used for p in placements if p.row is not None), default=math.inf)
        protected = [r for r in self.rows.values() if r.last_used > floor]
        held = _Held(self.block_size)  # continued rows count, whatever the budget is
        if token_budget is not None:
            for row in protected:
                row.blocks = self._blocks(row)
                held.add(row.context, row.blocks)
            for p in placements:
                if p.row is not None:
                    held.add(p.context, p.blocks)
        want = 0
        for p in fresh:
            if want >= room - len(protected) or (
                token_budget is not None and held.tokens + held.cost(p.context, p.blocks) > token_budget
            ):
                break
            p.keep = True
            want += 1
            if token_budget is not None:
                held.add(p.context, p.blocks)
        if token_budget is not None:
            for row in self.rows.values():
                if row.last_used <= floor:
                    row.blocks = self._blocks(row)
                    held.add(row.context, row.blocks)
        while self.rows and (
            len(self.rows) + want > room or (token_budget is not None and held.tokens > token_budget)
        ):
            row = self.rows.popitem(last=False)[1]
            if token_budget is not None:
                held.remove(row.context, row.blocks)
            evicted.append(row)
        self.evicted += len(evicted)
        self.resumed += continued
        self.restarted += len(fresh)
        if fresh:
            # what a fresh context can fork: a row holding its prefix, or that held it before
            # its last step (a prompt's row, continued by the first particle of a step that
            # the batcher split: the others fork it at the next calls), or continued now
            before = {r.previous: r for r in self.rows.values() if r.previous}
            for p in placements:
                if p.row is not None:
                    before[p.row.context] = p.row
                    if p.row.previous:
                        before.setdefault(p.row.previous, p.row)
            for p in fresh:
                p.source, p.source_depth = self._match(p.context, key, before)
        return Plan(placements, evicted)

    def _blocks(self, row: ResidentRow) -> tuple[int, ...]:
        """``row``'s block keys (computed once per context: a committed row keeps them)."""
        if not self.block_size:
            return ()
        return block_keys(row.context, self.block_size, row.blocks)

    def _parent(self, ctx: Context, key: Hashable) -> ResidentRow | None:
        return self._match(ctx, key)[0]

    def _match(
        self, ctx: Context, key: Hashable, also: dict[Context, ResidentRow] | None = None
    ) -> tuple[ResidentRow | None, int]:
        """The row of ``key`` under ``ctx``'s longest proper prefix at most ``max_gap``
        tokens shorter, among the live rows' contexts and ``also``, and that prefix's
        length (None, 0: none)."""
        for n in range(len(ctx) - 1, max(0, len(ctx) - 1 - self.max_gap), -1):
            row = self.rows.get(ctx[:n])
            if row is None and also:
                row = also.get(ctx[:n])
            if row is not None and row.key == key:
                return row, n
        return None, 0

    def commit(self, plan: Plan, states: Sequence[Any], key: Hashable) -> None:
        """The call ran: ``states[i]`` is the engine state of placement ``i`` (read where
        it is kept). Kept placements become the most recently used rows."""
        now = self.clock()
        for p, state in zip(plan.placements, states):
            if not p.keep:
                continue
            row = p.row if p.row is not None else ResidentRow(p.context, state, key)
            row.previous = row.context if p.row is not None else ()
            row.context, row.state, row.last_used, row.blocks = p.context, state, now, p.blocks
            self.rows[p.context] = row

    def shrink(self, capacity: int, token_budget: int | None = None) -> list[ResidentRow]:
        """Evict the least recently used rows until at most ``capacity`` are live, holding
        at most ``token_budget`` tokens (room the engine needs for something else, e.g. a
        burst's rows)."""
        out = []
        held = _Held(self.block_size)
        if token_budget is not None:
            for row in self.rows.values():
                row.blocks = self._blocks(row)
                held.add(row.context, row.blocks)
        while self.rows and (
            len(self.rows) > max(0, capacity) or (token_budget is not None and held.tokens > token_budget)
        ):
            row = self.rows.popitem(last=False)[1]
            if token_budget is not None:
                held.remove(row.context, row.blocks)
            out.append(row)
        self.evicted += len(out)
        return out

    def clear(self) -> list[ResidentRow]:
        """Remove and return every row (the engine ends them: a cache reset, close, a
        failed call)."""
        out = list(self.rows.values())
        self.rows.clear()
        return out

    def stats(self) -> dict[str, int]:
        return {
            "resident_rows": len(self.rows),
            "rows_resumed": self.resumed,
            "rows_restarted": self.restarted,
            "resident_evicted": self.evicted,
            "resident_expired": self.expired,
        }
