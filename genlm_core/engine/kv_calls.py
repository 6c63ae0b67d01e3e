"""The core's side of KV reuse: lookups, room, rounds and what is kept, for every engine.

An engine that resumes contexts from kept KV (capability ``"resume"``,
:mod:`genlm_core.engine.kv_rows`) computes; :class:`KVCalls` decides everything around
it, in one place for every such engine:

1. **Rounds.** A call's contexts are looked up in the prefix cache (the deepest kept
   proper prefix of each: its depth and the engine's payload) and planned in rounds
   (:mod:`genlm_core.engine.call_plan`): contexts nested in another of the call are read
   off its row where the engine can (``KVPolicy.read_off``), and a long new prefix
   several contexts share runs first, once (``KVPolicy.branch_tokens``).
2. **Room.** Before a part runs, the engine says how much room its rows lack
   (``kv_shortfall``); the core releases kept contexts the part does not read, by the
   rule the engine declared (``KVPolicy.release``), until they fit. A part that cannot
   fit runs in halves (a stack of parts, no recursion); a single row that cannot runs
   from its start once everything else is released. Under ``"resident"`` (the default,
   :mod:`genlm_core.engine.kv_resident`) the halves go oldest lineage first, and a part
   of several rows releases only what is younger than its rows: the prompt and a fixed
   subset of particles stay, the cost past the budget bounded by that module's arithmetic.
3. **Keeping.** The engine hands back a payload per context it can resume from later;
   the core keeps them in the prefix cache under the budget (under ``"resident"``, a
   context is kept only when younger ones make room for it), and hands back the owners
   nothing reads any more (``release_kv``).

The engine never reads the cache: a lookup made for a round stays valid for its parts
until the core stores or releases something, a fact local to :meth:`KVCalls.forward`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from genlm_core.engine.call_plan import PlannedRow, plan_round
from genlm_core.engine.kv_resident import Lineages
from genlm_core.engine.kv_reuse import KVReuse
from genlm_core.engine.kv_rows import KVPolicy, ResumeRow

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.config import BackendConfig
    from genlm_core.engine.contract import Engine
    from genlm_core.engine.decode_batches import DecodeBatches
    from genlm_core.protocols import PrefixKVCache

__all__ = ["MAX_BRANCH_ROUNDS", "KVCalls"]

Context = tuple[int, ...]

#: rounds of a call that may run branch points; later rounds run every pending context (a
#: call whose branch points the budget keeps releasing still ends)
MAX_BRANCH_ROUNDS = 16


class KVCalls:
    """The model calls of one engine that resumes from kept KV, and the KV it keeps.

    Args:
        engine: declares ``"resume"``; its :meth:`~genlm_core.engine.contract.Engine.kv_policy`
            is read here, once.
        config: the backend's config (``prefix_cache`` and ``prefix_cache_impl`` are read).
        name: the backend's name, for messages.
    """

    def __init__(self, engine: Engine, config: BackendConfig, name: str) -> None:
        policy = engine.kv_policy()
        if not isinstance(policy, KVPolicy):
            raise TypeError(
                f"{type(engine).__name__}.kv_policy() returned {policy!r}: an engine declaring "
                "'resume' returns a genlm_core.engine.KVPolicy"
            )
        self.engine = engine
        self.policy = policy
        #: the lineage rank of every kept payload (release "resident"), else None
        self.lineages: Lineages | None = Lineages() if policy.release == "resident" else None
        #: the prefix cache of the engine's payloads and the counters of its calls
        self.reuse = KVReuse.for_config(
            config,
            policy.budget,
            name=name,
            problem=policy.problem,
            sizeof=engine.kv_size,
            budget_option=policy.budget_option,
            owner=engine.kv_owner,
            release=engine.release_kv,
            on_evict=self.lineages.forget if self.lineages is not None else None,
        )
        self._leaves_only = policy.release in ("leaves", "resident") and _has_option(
            self.reuse.cache, "leaves_only"
        )
        self._ranked = self.lineages is not None and _has_option(self.reuse.cache, "rank")
        #: the core's decode step over the engine's kept batches (capability "kept_batches")
        self._decode: DecodeBatches | None = None
        if "kept_batches" in engine.supports:
            from genlm_core.engine.decode_batches import DecodeBatches

            self._decode = DecodeBatches(engine.decode_ops())
        self.counts = {"call_rounds": 0, "call_parts_split": 0, "rows_from_start": 0}

    # ------------------------------------------------------------------ calls
    def forward(self, contexts: list[Context]) -> Any:
        """The engine's scores for distinct ``contexts``, in order: one tensor when one part
        ran the whole call, else a list of rows."""
        try:
            return self._forward(contexts)
        except BaseException:
            if self.policy.drops_kv:  # the engine emptied its KV: nothing kept is valid
                self._forget_kept()
            raise

    def forward_uncached(self, contexts: list[Context]) -> Any:
        """Every context from its start, no kept KV read or kept (the reference)."""
        try:
            out = self.engine.forward_uncached(contexts)
        finally:
            if self.policy.drops_kv:
                self._forget_kept()
        self.reuse.count(sum(map(len, contexts)), 0)
        return out

    def _forward(self, contexts: list[Context]) -> Any:
        reuse, policy = self.reuse, self.policy
        out: dict[Context, Any] = {}
        pending = list(contexts)
        rounds = 0
        calls = 1  # the call counts once, however many parts it runs in
        lineages = self.lineages
        floor = lineages.next_rank if lineages is not None else 0  # lineages this call starts rank from here
        if lineages is not None:
            lineages.begin_call()
        while pending:
            rounds += 1
            looked: dict[Context, tuple[int, Any]] | None = dict(zip(pending, self._lookup(pending)))
            assert looked is not None
            branching = reuse.enabled and policy.branch_tokens is not None and rounds <= MAX_BRANCH_ROUNDS
            plan = plan_round(
                pending,
                [looked[c][0] for c in pending],
                policy.branch_tokens if branching else None,
                policy.read_off,
            )
            late: list[Context] = []
            todo = [plan.rows]
            while todo:
                part = todo.pop()
                rows, missed = self._resume(part, looked)
                # several rows release only what is younger than they are (one row: anything)
                limit = None
                if lineages is not None and len(rows) > 1:
                    limit = lineages.youngest_resident([r.payload for r in rows], floor)
                held = reuse.hold(self._owners(rows))  # what the part reads outlives any release
                with held:
                    fits, released = self._make_room(rows, limit)
                    if released:
                        looked = None  # a payload found for a later part may be gone
                    if not fits and len(part) > 1:
                        self.counts["call_parts_split"] += 1
                        if lineages is not None:  # the oldest lineages run first
                            part = [part[i] for i in lineages.order([r.payload for r in rows])]
                        half = len(part) // 2
                        todo += [part[half:], part[:half]]
                        continue
                if not fits:  # one row: from its start, once nothing else is kept
                    self.counts["rows_from_start"] += 1
                    looked = None
                    rows, missed = self._resume(part, {part[0].ctx: (0, None)})
                    self._make_room(rows)
                late += missed
                with reuse.hold(self._owners(rows)):
                    result = self.engine.forward_rows(rows)
                    reuse.count(
                        sum(r.new_tokens for r in rows) if result.computed is None else result.computed,
                        sum(r.depth for r in rows) if result.reused is None else result.reused,
                        calls,
                    )
                    calls = 0
                    if result.kept:
                        self._keep(result.kept, rows)
                        looked = None
                if (
                    not out
                    and not todo
                    and not late
                    and not plan.deferred
                    and rounds == 1
                    and [r.context for r in rows] == contexts
                    and all(r.wanted and not r.read_off for r in rows)
                ):
                    self.counts["call_rounds"] += 1
                    return result.rows  # the whole call in its order: the engine's output as is
                n = 0
                for r in rows:
                    for length in r.read_off:
                        out[r.context[:length]] = result.rows[n]
                        n += 1
                    if r.wanted:
                        out[r.context] = result.rows[n]
                    n += 1
            pending = plan.deferred + late
        self.counts["call_rounds"] += rounds
        return [out[c] for c in contexts]

    def _resume(
        self, part: Sequence[PlannedRow], looked: dict[Context, tuple[int, Any]] | None
    ) -> tuple[list[ResumeRow], list[Context]]:
        """The part's rows, each resuming from the deepest kept prefix of its context (the
        round's lookup while it is valid); read-off contexts the row no longer runs (a
        deeper prefix was kept since the round was planned) are left for a later round."""
        if looked is None or any(p.ctx not in looked for p in part):
            looked = dict(zip((p.ctx for p in part), self._lookup([p.ctx for p in part])))
        rows, missed = [], []
        for p in part:
            depth, payload = looked[p.ctx]
            read_off = tuple(len(c) for c in p.read_off if len(c) > depth)
            missed += [c for c in p.read_off if len(c) <= depth]
            rows.append(ResumeRow(p.ctx, depth, payload, read_off, p.wanted))
        return rows, missed

    def _lookup(self, contexts: list[Context]) -> list[tuple[int, Any]]:
        """The deepest kept prefix of each context (their lineages read by this call)."""
        found = self.reuse.lookup(contexts)
        if self.lineages is not None:
            self.lineages.touch(p for _, p in found if p is not None)
        return found

    def _owners(self, rows: list[ResumeRow]) -> list[Any]:
        owner = self.engine.kv_owner
        return [o for o in (owner(r.payload) for r in rows if r.payload is not None) if o is not None]

    def _make_room(self, rows: list[ResumeRow], limit: int | None = None) -> tuple[bool, bool]:
        """Release kept contexts the rows do not read (and, with ``limit``, only those of a
        lineage younger than ``limit`` or stale) until the engine has room for them.
        Returns (whether they fit, whether anything was released)."""
        engine = self.engine
        if engine.kv_shortfall(rows) <= 0:
            return True, False
        cache = self.reuse.cache
        owner = engine.kv_owner
        read = {id(r.payload) for r in rows if r.payload is not None}
        read |= {id(o) for o in (owner(r.payload) for r in rows if r.payload is not None) if o is not None}
        lineages = self.lineages

        def keep(payload: Any) -> bool:
            if id(payload) in read:
                return True
            o = owner(payload)
            if o is not None and id(o) in read:
                return True
            if limit is None or lineages is None or lineages.stale(payload):
                return False
            return lineages.rank(payload) <= limit

        # one row under "resident": a context others extend goes too once no leaf can (its
        # extensions may have been computed apart from it and hold none of its memory)
        inner = lineages is not None and len(rows) == 1
        released = False
        while engine.kv_shortfall(rows) > 0:
            if cache is None or self._evict(cache, keep, leaves_first=inner) is None:
                return False, released
            released = True
        return True, released

    def _evict(self, cache: PrefixKVCache, keep: Any, leaves_first: bool = False) -> Any:
        """Release one kept context ``keep`` lets go: under "resident" the youngest lineage's
        (leaves only, or leaves first), else the least recently used (leaves only under "leaves")."""
        if self._ranked:
            assert self.lineages is not None
            if leaves_first:
                return cache.evict_lru_kv(keep, leaves_first=True, rank=self.lineages.victim_key)  # type: ignore[call-arg]
            return cache.evict_lru_kv(keep, leaves_only=self._leaves_only, rank=self.lineages.victim_key)  # type: ignore[call-arg]
        if self._leaves_only:
            return cache.evict_lru_kv(keep, leaves_only=True)  # type: ignore[call-arg]
        return cache.evict_lru_kv(keep)

    def _keep(self, kept: Sequence[tuple[Context, Any]], rows: Sequence[ResumeRow] = ()) -> None:
        """Keep every payload the engine handed back; an owner no kept payload reads is
        handed back to the engine (one storing may evict another's entry: every owner is
        held until all are stored). Under "resident" each takes its row's lineage rank, and
        under a budget the cache counts it is kept only when younger contexts make room."""
        reuse, owner, lineages = self.reuse, self.engine.kv_owner, self.lineages
        # context -> its rank, the kept context it supersedes (its lineage's, branched off by none)
        ranks: dict[Context, tuple[int, Any]] = {}
        if lineages is not None:
            inherited = [lineages.inherit(r.payload) for r in rows]  # (every row's, then the sharing)
            for r, (rank, carries) in zip(rows, inherited):
                value = rank, r.payload if carries and not lineages.shared(r.payload) else None
                ranks[r.context] = value
                for n in r.read_off:
                    ranks[r.context[:n]] = value
        owners = [o for o in (owner(p) for _, p in kept) if o is not None]
        with reuse.hold(owners):
            for context, payload in kept:
                rank, superseded = ranks.get(context, (None, None))
                if lineages is not None and rank is None:
                    rank, _ = lineages.inherit(None)
                if rank is not None and not self._admit(payload, rank, superseded):
                    continue  # it cannot stay: its owner goes back once nothing reads it
                if reuse.store(context, payload) and rank is not None:
                    assert lineages is not None
                    lineages.set(payload, rank)

    def _admit(self, payload: Any, rank: int, source: Any = None) -> bool:
        """Whether the cache's own budget (``KVPolicy.budget``) has room for ``payload`` of
        lineage ``rank``, made by releasing first ``source`` (the context of its lineage it
        carries on, which a payload that owns its memory makes redundant; never one another
        lineage branched off, such as a prompt), then stale or younger lineages (leaves
        first): False when only older ones could make it (the payload is then not kept)."""
        cache = self.reuse.cache
        budget = getattr(cache, "budget", None)
        used = getattr(cache, "kv_bytes", None)
        if cache is None or budget is None or used is None or self.lineages is None:
            return True
        size = cache.sizeof(payload)
        if size > budget:
            return False
        lineages = self.lineages

        def keep(p: Any) -> bool:
            return not lineages.stale(p) and lineages.rank(p) < rank

        if source is not None and cache.kv_bytes + size > budget:  # type: ignore[attr-defined]
            cache.evict_lru_kv(lambda p: p is not source)
        while cache.kv_bytes + size > budget:  # type: ignore[attr-defined]
            if self._evict(cache, keep, leaves_first=True) is None:
                self.reuse._dropped_unread()  # the budget holds less than one step keeps: said once
                return False
        return True

    # ------------------------------------------------------------------ bursts over kept batches
    def decode_step(self, rows: Any, released: Any, batch_size: int) -> Any:
        """A burst step through the core's kept batches (capability ``"kept_batches"``:
        :class:`~genlm_core.engine.decode_batches.DecodeBatches` over the engine's
        ``decode_ops()``)."""
        import torch

        assert self._decode is not None, "decode_step needs the capability 'kept_batches'"
        return self._decode.decode_step(
            rows, released, batch_size=batch_size, kv=self.reuse, forward=self.forward, cat=torch.cat
        )

    def end_burst(self, released: Any) -> None:
        if self._decode is not None:
            self._decode.end_burst(released, self.reuse)

    # ------------------------------------------------------------------ state
    def clear(self) -> None:
        """Drop every kept payload (their owners handed back) and every kept batch."""
        if self._decode is not None:
            self._decode.clear()
        self.reuse.clear()

    def forget(self) -> None:
        """The engine freed all its KV itself: drop every payload without handing any back."""
        if self._decode is not None:
            self._decode.clear()
        self._forget_kept()

    def _forget_kept(self) -> None:
        self.reuse.forget()  # (the cache tells no one of what it drops)
        if self.lineages is not None:
            self.lineages.clear()

    def stats(self) -> dict[str, Any]:
        out = {**self.reuse.stats(), **self.counts}
        if self._decode is not None:
            out.update(self._decode.stats())
        return out


def _has_option(cache: Any, option: str) -> bool:
    """Whether a registered prefix cache's ``evict_lru_kv`` takes ``option``
    (``leaves_only``, ``rank``): a cache without it releases by plain LRU (a shared prompt
    may then go before its particles)."""
    if cache is None:
        return False
    try:
        return option in inspect.signature(cache.evict_lru_kv).parameters
    except (TypeError, ValueError):
        return False
