"""genlm-hf's decode batches: the batch KV buffer of a burst step kept for the next step.

The core's :class:`~genlm_core.engine.decode_batches.DecodeBatches` decides which batch
resumes, which is assembled and from what; this module runs them. An assembled batch
is one :func:`~genlm_hf.kv.run_rows` pass into a fresh buffer with ``headroom`` free
columns, kept when every row ended at the same column (else its rows go to the prefix
cache, as ``forward`` stores them). A resumed batch writes its new tokens' KV into
column ``end`` of its buffer (:func:`~genlm_hf.kv.resume_rows`), the model seeing
columns ``[end - longest past, end]``: the mask, positions and past a fresh pass
would have. No copy in, no copy out, no prefix-cache traffic while the rows only grow;
a full buffer moves to one with ``headroom`` more columns (a copy every ``headroom``
steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from genlm_core.engine import KVReuse
from genlm_core.engine.contexts import Context
from genlm_core.engine.decode_batches import KeptBatch
from genlm_hf.kv import Row, Slots, copy_out, resume_rows
from genlm_hf.static import StaticBatch, StaticDecoder

__all__ = ["HFDecodeOps", "KeptBuffer"]


@dataclass
class KeptBuffer:
    """A batch buffer ``[n_layers, 2, B, heads, capacity, head_dim]``: row ``i`` holds the
    KV of its context in columns ``[end - len(context), end)``; the model sees columns
    ``[start, end)`` (the longest context fills them)."""

    buf: torch.Tensor
    start: int
    end: int


class HFDecodeOps:
    """:class:`~genlm_core.engine.decode_batches.DecodeOps` over a transformers model."""

    def __init__(self, engine: Any, headroom: int = 16, static: StaticDecoder | None = None) -> None:
        self.engine = engine
        self.headroom = headroom
        self.static = static  # kept batches on static buffers (genlm_hf.static), or None

    def assemble(self, contexts: list[Context], sources: list[tuple[int, Any]]) -> tuple[Any, Any]:
        engine = self.engine
        rows = [Row(c, depth, payload) for c, (depth, payload) in zip(contexts, sources)]
        # on the static path the batch runs in the engine's workspace and joins a static
        # slot; else it runs into a buffer of its own with headroom for the next steps
        room = {"workspace": engine.workspace} if self.static is not None else {"headroom": self.headroom}
        logits, slots = engine.run_rows(rows, **room)
        if self.static is not None:
            batch = self.static.keep(rows, slots)  # the rows join the static path
            if batch is not None:
                return logits, batch
            for r, payload in zip(rows, copy_out(slots, rows)):  # no room there: store them
                engine.kv.store(r.ctx, payload)
            return logits, None
        new = {len(r.ctx) - r.depth for r in rows}
        if len(new) == 1:  # every row ends at the same column: keep the buffer
            return logits, KeptBuffer(slots.buf, 0, slots.filled + new.pop())
        # rows of several lengths (a prompt added beside running rows): store them
        kv: KVReuse = engine.kv
        for r, payload in zip(rows, copy_out(slots, rows)):
            kv.store(r.ctx, payload)
        return logits, None

    def resume(self, batch: KeptBatch, contexts: list[Context]) -> Any:
        if isinstance(batch.state, StaticBatch):
            return self.static.resume(batch.state, [c[-1] for c in contexts])  # type: ignore[union-attr]
        kept: KeptBuffer = batch.state
        _make_room(kept, self.headroom)
        depths = [len(c) for c in batch.contexts]
        start = kept.end - max(depths)  # the longest past, as a fresh pass would have
        slots = Slots.resume(kept.buf, start, kept.end)
        engine = self.engine
        logits = resume_rows(
            engine.model, slots, [c[-1] for c in contexts], depths, logits_to_keep=engine.logits_to_keep
        )
        kept.start, kept.end = start, kept.end + 1
        return logits

    def row_kv(self, batch: KeptBatch, i: int, depth: int, copy: bool) -> Any:
        if isinstance(batch.state, StaticBatch):
            return self.static.row_kv(batch.state, i, depth, copy)  # type: ignore[union-attr]
        kept: KeptBuffer = batch.state
        first = kept.end - len(batch.contexts[i])
        view = kept.buf[:, :, i, :, first : first + depth]
        return view.clone(memory_format=torch.contiguous_format) if copy else view


def _make_room(kept: KeptBuffer, headroom: int) -> None:
    """Make sure column ``end`` exists: columns ``[start, end)`` move to a buffer with
    ``headroom`` free columns after them."""
    if kept.end < kept.buf.shape[-2]:
        return
    shape = list(kept.buf.shape)
    used = kept.end - kept.start
    shape[-2] = used + 1 + headroom
    buf = kept.buf.new_empty(shape)
    buf[..., :used, :].copy_(kept.buf[..., kept.start : kept.end, :])
    kept.buf, kept.start, kept.end = buf, 0, used
