"""Decode batches: a burst's rows kept in the engine's batch layout between its steps.

A burst (:mod:`genlm_core.engine.burst`) asks, step after step, for the next-token rows
of contexts that each extend a context of the step before by one token. Through an
engine's ``forward`` every step would assemble a batch from the prefix cache (each row's
KV copied in), run it, and copy each row's KV back out. :class:`DecodeBatches` keeps
each batch's state instead, and the next step runs its new tokens over it in place.

The bookkeeping lives here, once; an engine supplies the three things only it can do
(:class:`DecodeOps`): run a batch afresh from sources (:meth:`~DecodeOps.assemble`),
run one more token per row over a kept batch (:meth:`~DecodeOps.resume`), and cut one
row's KV out of a kept batch (:meth:`~DecodeOps.row_kv`).

The contexts of a step are computed as the step loop computes them: distinct contexts,
in order, in batches of ``batch_size`` (:func:`~genlm_core.engine.contexts.run_distinct`).
A row is its handle, as for every engine's decode step: a kept batch knows the handles
of its rows, and a batch of the step resumes a kept batch when each of its rows
continues the kept row at the same position - one of its handles was there, and its
context is the kept one plus one token. The engine shows the model what a fresh pass
would show it (mask, positions, past), so a burst and the step loop give the same
numbers. Any other batch (rows added, ended or resampled) is assembled from the kept
batches' KV where a context's parent is live, whatever its handle (a resampled
particle, re-added under a new handle, copies its parent's), else from the prefix
cache. Rows of dropped batches that no context of the step extends go to the prefix
cache, where a later step or a step loop finds them; so do all rows when the burst
ends (:meth:`DecodeBatches.end_burst`).

Kept batches live outside the prefix cache's budget for the length of a burst.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from genlm_core import _deprecated
from genlm_core.engine.contexts import Context, run_distinct
from genlm_core.engine.kv_reuse import KVReuse

__all__ = ["DecodeBatches", "DecodeOps", "KeptBatch"]


@dataclass
class KeptBatch:
    """A batch kept between steps: the contexts whose KV its engine ``state`` holds, in
    row order, and the handles of each row (the burst's rows whose context it is)."""

    contexts: list[Context]
    state: Any
    handles: list[frozenset[int]] = field(default_factory=list)


class DecodeOps(Protocol):
    """What an engine does for :class:`DecodeBatches` (under the engine's lock)."""

    def assemble(self, contexts: list[Context], sources: list[tuple[int, Any]]) -> tuple[Any, Any]:
        """Run distinct ``contexts`` as one fresh batch, context ``i`` resuming from
        ``sources[i] = (depth, payload)`` (the KV of its first ``depth`` tokens; depth 0,
        None: nothing). Returns the batch's next-token output and the state to keep, or
        None for no state (the engine then stored the rows' KV itself)."""
        ...

    def resume(self, batch: KeptBatch, contexts: list[Context]) -> Any:
        """Run one more token per row over ``batch`` (``contexts[i]`` is
        ``batch.contexts[i]`` plus one token), updating its state in place. Returns the
        output."""
        ...

    def row_kv(self, batch: KeptBatch, i: int, depth: int, copy: bool) -> Any:
        """The KV payload of the first ``depth`` tokens of row ``i`` (a copy the prefix
        cache may keep when ``copy``, else anything an :meth:`assemble` of this step
        reads before the batch changes)."""
        ...


class DecodeBatches:
    """The kept batches of one engine, and its counters."""

    def __init__(self, ops: DecodeOps) -> None:
        self.ops = ops
        self.batches: list[KeptBatch] = []
        self.resumed = 0  # batches run over a kept state
        self.assembled = 0  # batches assembled afresh

    def decode_step(
        self,
        rows: Mapping[int, Context],
        released: Collection[int] = (),
        *,
        batch_size: int,
        kv: KVReuse,
        forward: Callable[[list[Context]], Any],
        cat: Callable[[list[Any]], Any],
    ) -> Any:
        """An engine's whole :meth:`~genlm_core.engine.contract.Engine.decode_step`: the
        output of every row of ``rows`` (handle -> context, never empty) in order (``cat``
        joins the batches' outputs; a row repeating a context gets its row). ``released``:
        handles dropped since the last step (their kept rows continue no row now). The
        rows' distinct contexts run in the step loop's batches, over kept batches when
        ``kv`` is on, else through ``forward`` (the engine's own, whose outputs must be the
        same kind as its :class:`DecodeOps`'). The burst ends with :meth:`end_burst`."""
        if not rows:
            raise ValueError(
                "DecodeBatches.decode_step: a decode step has rows; a burst ends with "
                "end_burst(released) (formerly decode_step({}, released))"
            )
        self._release(released)
        if kv.enabled:
            handles: dict[Context, set[int]] = {}
            for h, c in rows.items():
                handles.setdefault(c, set()).add(h)

            def run(chunks: list[list[Context]]) -> Any:
                return _joined(self.run_batches(chunks, handles, kv), cat)
        else:

            def run(chunks: list[list[Context]]) -> Any:
                return _joined([forward(chunk) for chunk in chunks], cat)

        return run_distinct(list(rows.values()), batch_size, run)

    def run_batches(
        self, chunks: Sequence[list[Context]], handles: Mapping[Context, Collection[int]], kv: KVReuse
    ) -> list[Any]:
        """The outputs of the batches ``chunks`` (distinct contexts), one per batch, in
        order; ``handles[c]``: the handles whose context is ``c``. Counts each batch's
        tokens on ``kv``."""
        old = self.batches
        live = {c: (b, i) for b in old for i, c in enumerate(b.contexts)}
        at: dict[int, list[tuple[KeptBatch, int]]] = {}
        for b in old:
            for i, hs in enumerate(b.handles):
                for h in hs:
                    at.setdefault(h, []).append((b, i))
        # plan every batch against the kept state before any of them runs
        plans: list[tuple[list[Context], KeptBatch | None, list[tuple[int, Any]] | None]] = []
        resumed: set[int] = set()
        for chunk in chunks:
            batch = self._resumable(chunk, handles, at, resumed)
            if batch is not None:
                resumed.add(id(batch))
                plans.append((chunk, batch, None))
            else:
                plans.append((chunk, None, self._sources(chunk, live, kv)))
        outputs, kept = [], []
        for chunk, batch, sources in plans:
            row_handles = [frozenset(handles.get(c, ())) for c in chunk]
            if batch is not None:
                outputs.append(self.ops.resume(batch, chunk))
                kv.count(len(chunk), sum(len(c) - 1 for c in chunk))
                batch.contexts, batch.handles = chunk, row_handles
                kept.append(batch)
                self.resumed += 1
                continue
            out, state = self.ops.assemble(chunk, sources)  # type: ignore[arg-type]
            reused = sum(d for d, _ in sources)  # type: ignore[union-attr]
            kv.count(sum(map(len, chunk)) - reused, reused)
            outputs.append(out)
            if state is not None:
                kept.append(KeptBatch(chunk, state, row_handles))
            self.assembled += 1
        self.batches = kept
        self._store_ended(old, kept, [c for chunk in chunks for c in chunk], kv)
        return outputs

    #: deprecated: :meth:`run_batches` (see :func:`genlm_core._deprecated.decode_batches_step`)
    step = _deprecated.decode_batches_step

    def _release(self, released: Collection[int]) -> None:
        """Released handles continue no kept row (a handle may be added again, as a new row)."""
        if not released:
            return
        gone = frozenset(released)
        for b in self.batches:
            b.handles = [hs - gone for hs in b.handles]

    @staticmethod
    def _resumable(
        chunk: list[Context],
        handles: Mapping[Context, Collection[int]],
        at: Mapping[int, list[tuple[KeptBatch, int]]],
        taken: set[int],
    ) -> KeptBatch | None:
        """The kept batch whose rows ``chunk`` continues row by row, in order: each row's
        handle was at the same row of it, and its context extends that row's by one token."""
        for batch, i in (p for h in handles.get(chunk[0], ()) for p in at.get(h, ())):
            if i != 0 or id(batch) in taken or not len(batch.contexts) == len(batch.handles) == len(chunk):
                continue
            if all(
                len(c) == len(p) + 1 and c[:-1] == p and not hs.isdisjoint(handles.get(c, ()))
                for c, p, hs in zip(chunk, batch.contexts, batch.handles)
            ):
                return batch
        return None

    def _sources(
        self, chunk: list[Context], live: dict[Context, tuple[KeptBatch, int]], kv: KVReuse
    ) -> list[tuple[int, Any]]:
        """``(depth, payload)`` of each context: its parent's KV in a kept batch, else the
        prefix cache's deepest proper prefix."""
        out: list[tuple[int, Any] | None] = []
        missing = []
        for c in chunk:
            parent = live.get(c[:-1]) if len(c) > 1 else None
            if parent is not None:
                out.append((len(c) - 1, self.ops.row_kv(parent[0], parent[1], len(c) - 1, False)))
            else:
                out.append(None)
                missing.append(c)
        found = iter(kv.lookup(missing)) if missing else iter(())
        return [o if o is not None else next(found) for o in out]

    def _store_ended(
        self, old: list[KeptBatch], kept: list[KeptBatch], contexts: Sequence[Context], kv: KVReuse
    ) -> None:
        """Rows of dropped batches that no context of this step extends go to the prefix cache."""
        if not kv.enabled:
            return
        kept_ids = {id(b) for b in kept}
        parents = {c[:-1] for c in contexts}
        for b in old:
            if id(b) in kept_ids:
                continue
            for i, c in enumerate(b.contexts):
                if c not in parents:
                    kv.store(c, self.ops.row_kv(b, i, len(c), True))

    def end_burst(self, released: Collection[int], kv: KVReuse) -> None:
        """An engine's whole :meth:`~genlm_core.engine.contract.Engine.end_burst`: every
        kept row to the prefix cache, the states freed (``released``: the burst's last
        handles; every kept row is theirs)."""
        self.flush(kv)

    def flush(self, kv: KVReuse) -> None:
        """Every kept row to the prefix cache, the states freed."""
        old, self.batches = self.batches, []
        self._store_ended(old, [], [], kv)

    def clear(self) -> None:
        """Drop the kept batches without storing them (the model's weights changed)."""
        self.batches = []

    def stats(self) -> dict[str, Any]:
        return {
            "decode_batches": len(self.batches),
            "decode_rows": sum(len(b.contexts) for b in self.batches),
            "decode_batches_resumed": self.resumed,
            "decode_batches_assembled": self.assembled,
        }


def _joined(outs: list[Any], cat: Callable[[list[Any]], Any]) -> Any:
    """The batches' outputs as one (no join for one batch)."""
    return outs[0] if len(outs) == 1 else cat(outs)
