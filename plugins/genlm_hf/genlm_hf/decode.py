"""Decode batches: the KV of a burst's rows kept in the model's batch layout between steps.

A burst (:mod:`genlm_core.engine.burst`) asks, step after step, for the next-token rows of
contexts that each extend a context of the step before by one token. Through
:meth:`HFEngine.forward <genlm_hf.backend.HFEngine.forward>` every step would copy each
row's cached KV into a fresh batch buffer, run the model, then copy each row's KV out
again into the prefix cache. Here the buffer of a step is kept (:class:`DecodeBatch`,
with ``headroom`` free columns), and the next step writes its new tokens' KV into it in
place: no copy in, no copy out, no prefix-cache traffic while the rows only grow.

The contexts of a step are computed as the step loop computes them: distinct contexts,
in order, in batches of ``batch_size``; a batch whose contexts each extend, in order, the
contexts of a kept batch by one token resumes it (:func:`~genlm_hf.kv.resume_rows`: the
model sees the same mask, positions and past as a fresh pass). Any other batch (rows
added, ended or resampled) is assembled afresh (:func:`~genlm_hf.kv.run_rows`) from the
kept batches' KV where a context's parent is live, else from the prefix cache. Rows of
kept batches no longer extended go to the prefix cache, where a later step or a step
loop finds them; so do all rows when the burst ends (:meth:`DecodeBatches.flush`).

Kept batches live outside the prefix cache's budget, for the length of a burst: the KV
of the live rows plus ``headroom`` columns each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from genlm_core.engine import KVReuse
from genlm_hf.kv import Row, Slots, copy_out, resume_rows, run_rows

__all__ = ["DecodeBatch", "DecodeBatches"]

Context = tuple[int, ...]


@dataclass
class DecodeBatch:
    """A kept batch buffer ``[n_layers, 2, B, heads, capacity, head_dim]``: row ``i`` holds
    the KV of ``contexts[i]`` in columns ``[end - len(contexts[i]), end)``; columns
    ``[start, end)`` are those the model sees (the longest context fills them)."""

    contexts: list[Context]
    buf: torch.Tensor
    start: int
    end: int

    def kv(self, i: int, depth: int) -> torch.Tensor:
        """The KV of the first ``depth`` tokens of row ``i``'s context (a view)."""
        first = self.end - len(self.contexts[i])
        return self.buf[:, :, i, :, first : first + depth]

    def room(self, headroom: int) -> None:
        """Make sure column ``end`` exists: move columns ``[start, end)`` to a buffer with
        ``headroom`` free columns after them (a copy every ``headroom`` steps)."""
        if self.end < self.buf.shape[-2]:
            return
        shape = list(self.buf.shape)
        used = self.end - self.start
        shape[-2] = used + 1 + headroom
        buf = self.buf.new_empty(shape)
        buf[..., :used, :].copy_(self.buf[..., self.start : self.end, :])
        self.buf, self.start, self.end = buf, 0, used


class DecodeBatches:
    """The kept batches of an engine (one model, one lock: the backend's)."""

    def __init__(self, headroom: int = 16) -> None:
        self.headroom = headroom
        self.batches: list[DecodeBatch] = []
        self.resumed = 0  # batches run over a kept buffer
        self.assembled = 0  # batches assembled afresh

    def step(
        self,
        model: Any,
        contexts: list[Context],
        batch_size: int,
        kv: KVReuse,
        *,
        logits_to_keep: bool,
        pad_id: int,
    ) -> torch.Tensor:
        """The next-token logits ``(len(contexts), V')`` of distinct ``contexts``, in batches of
        ``batch_size`` in order (the step loop's batches)."""
        old = self.batches
        live = {c: (b, i) for b in old for i, c in enumerate(b.contexts)}
        chunks = [contexts[i : i + batch_size] for i in range(0, len(contexts), batch_size)]
        # plan every batch against the kept state before any of them runs
        plans: list[tuple[list[Context], DecodeBatch | None, list[Row] | None]] = []
        used: set[int] = set()
        for chunk in chunks:
            parent = live.get(chunk[0][:-1])
            batch = parent[0] if parent is not None and parent[1] == 0 else None
            if (
                batch is not None
                and id(batch) not in used
                and len(batch.contexts) == len(chunk)
                and all(c[:-1] == p for c, p in zip(chunk, batch.contexts))
            ):
                used.add(id(batch))
                plans.append((chunk, batch, None))
                continue
            rows = []
            for c, (depth, cached) in zip(chunk, self._sources(chunk, live, kv)):
                rows.append(Row(c, depth, cached))
            plans.append((chunk, None, rows))
        out, kept = [], []
        for chunk, batch, rows in plans:
            if batch is not None:
                out.append(self._resume(model, batch, chunk, kv, logits_to_keep))
                kept.append(batch)
                continue
            logits, slots = run_rows(
                model,
                rows,
                use_cache=True,
                logits_to_keep=logits_to_keep,
                pad_id=pad_id,
                headroom=self.headroom,  # type: ignore[arg-type]
            )
            self.assembled += 1
            kv.count(sum(len(r.ctx) - r.depth for r in rows), sum(r.depth for r in rows))  # type: ignore[union-attr]
            out.append(logits)
            assert slots is not None and rows is not None
            new = {len(r.ctx) - r.depth for r in rows}
            if len(new) == 1:  # every row ends at the same column: keep the buffer
                kept.append(DecodeBatch(list(chunk), slots.buf, 0, slots.filled + new.pop()))  # type: ignore[arg-type]
            else:  # rows of several lengths (a prompt added beside running rows): store them
                for r, payload in zip(rows, copy_out(slots, rows)):
                    kv.store(r.ctx, payload)
        self.batches = kept
        self._store_ended(old, kept, contexts, kv)
        return out[0] if len(out) == 1 else torch.cat(out)

    def _sources(
        self, chunk: list[Context], live: dict[Context, tuple[DecodeBatch, int]], kv: KVReuse
    ) -> list[tuple[int, Any]]:
        """``(depth, kv)`` of each context: its parent's KV in a kept batch, else the prefix
        cache's deepest prefix."""
        out: list[tuple[int, Any] | None] = []
        missing = []
        for c in chunk:
            parent = live.get(c[:-1]) if len(c) > 1 else None
            if parent is not None:
                out.append((len(c) - 1, parent[0].kv(parent[1], len(c) - 1)))
            else:
                out.append(None)
                missing.append(c)
        found = iter(kv.lookup(missing)) if missing else iter(())
        return [o if o is not None else next(found) for o in out]

    def _resume(
        self, model: Any, batch: DecodeBatch, chunk: list[Context], kv: KVReuse, logits_to_keep: bool
    ) -> torch.Tensor:
        batch.room(self.headroom)
        depths = [len(c) for c in batch.contexts]
        # the model sees columns [start', end]: the longest past, as a fresh pass would
        start = batch.end - max(depths)
        slots = Slots.resume(batch.buf, start, batch.end)
        logits = resume_rows(model, slots, [c[-1] for c in chunk], depths, logits_to_keep=logits_to_keep)
        batch.contexts, batch.start, batch.end = list(chunk), start, batch.end + 1
        self.resumed += 1
        kv.count(len(chunk), sum(depths))
        return logits

    @staticmethod
    def _store_ended(
        old: list[DecodeBatch], kept: list[DecodeBatch], contexts: list[Context], kv: KVReuse
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
                    kv.store(c, b.kv(i, len(c)).clone(memory_format=torch.contiguous_format))

    def flush(self, kv: KVReuse) -> None:
        """The burst ended: every kept row to the prefix cache, the buffers freed."""
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
