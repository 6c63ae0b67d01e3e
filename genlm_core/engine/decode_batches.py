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
in order, in batches of ``batch_size``. A batch whose contexts each extend, in order,
the contexts of a kept batch by one token resumes it; the engine shows the model what a
fresh pass would show it (mask, positions, past), so a burst and the step loop give the
same numbers. Any other batch (rows added, ended or resampled) is assembled from the
kept batches' KV where a context's parent is live (a resampled particle copies its
parent's), else from the prefix cache. Rows of dropped batches that no context of the
step extends go to the prefix cache, where a later step or a step loop finds them; so
do all rows when the burst ends (:meth:`DecodeBatches.flush`).

Kept batches live outside the prefix cache's budget for the length of a burst.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from genlm_core.engine.kv_reuse import KVReuse

__all__ = ["DecodeBatches", "DecodeOps", "KeptBatch"]

Context = tuple[int, ...]


@dataclass
class KeptBatch:
    """A batch kept between steps: the contexts whose KV its engine ``state`` holds, in
    row order."""

    contexts: list[Context]
    state: Any


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
        *,
        batch_size: int,
        kv: KVReuse,
        forward: Callable[[list[Context]], Any],
        cat: Callable[[list[Any]], Any],
    ) -> Any:
        """An engine's whole :meth:`~genlm_core.engine.contract.Engine.decode_step`: None
        when the burst ended (``rows`` empty: every kept row flushed); else the output of
        every row in order (``cat`` joins the batches' outputs; a row repeating a context
        gets its row). The rows' distinct contexts run in the step loop's batches, over
        kept batches when ``kv`` is on, else through ``forward`` (the engine's own, whose
        outputs must be the same kind as its :class:`DecodeOps`')."""
        if not rows:
            self.flush(kv)
            return None
        contexts = list(rows.values())
        unique = list(dict.fromkeys(contexts))
        if kv.enabled:
            outs = self.step(unique, batch_size, kv)
        else:
            outs = [forward(unique[i : i + batch_size]) for i in range(0, len(unique), batch_size)]
        out = outs[0] if len(outs) == 1 else cat(outs)
        if len(unique) < len(contexts):
            where = {c: i for i, c in enumerate(unique)}
            out = out[[where[c] for c in contexts]]
        return out

    def step(self, contexts: Sequence[Context], batch_size: int, kv: KVReuse) -> list[Any]:
        """The outputs of distinct ``contexts`` in batches of ``batch_size``, one per batch,
        in order. Counts each batch's tokens on ``kv``."""
        old = self.batches
        live = {c: (b, i) for b in old for i, c in enumerate(b.contexts)}
        chunks = [list(contexts[i : i + batch_size]) for i in range(0, len(contexts), batch_size)]
        # plan every batch against the kept state before any of them runs
        plans: list[tuple[list[Context], KeptBatch | None, list[tuple[int, Any]] | None]] = []
        resumed: set[int] = set()
        for chunk in chunks:
            batch = self._resumable(chunk, live, resumed)
            if batch is not None:
                resumed.add(id(batch))
                plans.append((chunk, batch, None))
            else:
                plans.append((chunk, None, self._sources(chunk, live, kv)))
        outputs, kept = [], []
        for chunk, batch, sources in plans:
            if batch is not None:
                outputs.append(self.ops.resume(batch, chunk))
                kv.count(len(chunk), sum(len(c) - 1 for c in chunk))
                batch.contexts = chunk
                kept.append(batch)
                self.resumed += 1
                continue
            out, state = self.ops.assemble(chunk, sources)  # type: ignore[arg-type]
            reused = sum(d for d, _ in sources)  # type: ignore[union-attr]
            kv.count(sum(map(len, chunk)) - reused, reused)
            outputs.append(out)
            if state is not None:
                kept.append(KeptBatch(chunk, state))
            self.assembled += 1
        self.batches = kept
        self._store_ended(old, kept, contexts, kv)
        return outputs

    @staticmethod
    def _resumable(
        chunk: list[Context], live: dict[Context, tuple[KeptBatch, int]], taken: set[int]
    ) -> KeptBatch | None:
        """The kept batch whose contexts ``chunk`` extends row by row, in order."""
        parent = live.get(chunk[0][:-1])
        if parent is None or parent[1] != 0:
            return None
        batch = parent[0]
        if id(batch) in taken or len(batch.contexts) != len(chunk):
            return None
        return batch if all(c[:-1] == p for c, p in zip(chunk, batch.contexts)) else None

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

    def flush(self, kv: KVReuse) -> None:
        """The burst ended: every kept row to the prefix cache, the states freed."""
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
