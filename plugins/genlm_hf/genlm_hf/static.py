"""A static decode step: a kept decode batch over KV buffers of a fixed shape, ready to be
captured as a CUDA graph (issue 44).

A burst's kept batches (:mod:`genlm_hf.decode`) grow by one token a step. The eager
path (:func:`genlm_hf.kv.resume_rows`) builds the mask, the positions and a cache
object each step and runs the model over exactly the columns in use; every shape
changes every step, so the step cannot be replayed. Here a kept batch lives in a
:class:`StaticSlot`: a buffer ``[n_layers, 2, B, kv_heads, C, head_dim]`` of a fixed
*bucket* ``(B, C)``, plus static input tensors (each row's new token and its position)
and, on CUDA, the step captured once as a ``torch.cuda.CUDAGraph`` and replayed.

Layout: row ``i`` holds the KV of its context (``n_i`` tokens) in columns ``[0, n_i)``;
its new token's KV is written at column ``n_i`` (a scatter at an index tensor, so the
column is data, not a Python int), it sits at position ``n_i`` and attends to columns
``[0, n_i]`` (a mask computed on the device from the positions). That is the mask and
the positions a fresh pass would use; the columns past ``n_i`` are masked (their weight
is exactly 0; they hold finite values: zeros or an earlier row's KV). Rows ``n..B-1`` of
a batch of ``n < B`` rows are padding (position 0, the pad token); their logits are
dropped.

Buckets: ``B`` is the batch's row count rounded up to a power of two (at most the
engine's ``batch_size``); ``C`` is the longest context plus one rounded up to a power of
two, at least :data:`MIN_COLUMNS`, at most the model's ``max_position_embeddings``. A
batch whose rows outgrow ``C`` moves to the next bucket (one copy per doubling). A
bucket's buffer takes ``n_layers * 2 * B * kv_heads * C * head_dim * itemsize`` bytes
(SmolLM2-135M float32: 46,080 bytes per row and column, so 64 rows x 64 columns take
189 MB). Slots are pooled by bucket: a batch that ends gives its slot back, and free
slots are dropped least recently used first so that all slots together stay within
``static_decode_bytes``; a batch that finds no room runs on the eager path. A batch
that outgrows its bucket moves to the longer one even past the bound (it cannot go back
to the eager path mid-burst); slots given back while the bound is passed are dropped.

Rows that cannot extend a kept batch (a new prompt, a prefix from the prefix cache, a
resampled particle) run on the eager path (:func:`genlm_hf.kv.run_rows`) and their KV is
copied into a slot, from where they continue.

On CUDA the first step of a slot runs twice on a side stream (warm-up: each run writes
the same KV at the same column, so it is idempotent), is then captured, and every later
step replays the graph: the host only copies the new tokens and positions in. Each
graph has its own memory pool (replays come in any order, so pools are not shared).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from genlm_core.engine import note
from genlm_hf.cache_names import cache_kwarg, output_cache
from genlm_hf.fused import FusedLlama
from genlm_hf.kv import Row, Slots

__all__ = [
    "MASKS",
    "MIN_COLUMNS",
    "StaticBatch",
    "StaticDecoder",
    "StaticSlot",
    "batch_bucket",
    "column_bucket",
]

#: the smallest length bucket
MIN_COLUMNS = 16
#: attention implementations whose 4D mask this module builds (bool for sdpa, additive for eager)
MASKS = {"sdpa": "bool", "eager": "additive"}


def batch_bucket(rows: int, batch_size: int) -> int:
    """``rows`` rounded up to a power of two, at most ``max(rows, batch_size)``."""
    b = 1
    while b < rows:
        b *= 2
    return max(rows, min(b, batch_size))


def column_bucket(columns: int, limit: int | None) -> int | None:
    """``columns`` rounded up to a power of two (at least :data:`MIN_COLUMNS`), at most
    ``limit``; None when ``columns`` exceeds ``limit``."""
    if limit is not None and columns > limit:
        return None
    c = MIN_COLUMNS
    while c < columns:
        c *= 2
    return c if limit is None else min(c, limit)


class _StaticLayer(DynamicLayer):
    """A cache layer over one layer of a slot's buffer: ``update`` scatters the new
    token's KV into each row's column and returns the whole buffer (``C`` columns)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, index: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self._index = keys, values, index
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.keys.shape[-2]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys.scatter_(2, self._index, key_states)
        self.values.scatter_(2, self._index, value_states)
        return self.keys, self.values


class StaticSlot:
    """One bucket's buffer, its static inputs and (on CUDA, once run) its graph."""

    def __init__(
        self,
        model: Any,
        bucket: tuple[int, int],
        kv_shape: tuple[int, int, int],
        dtype: torch.dtype,
        device: torch.device,
        mask: str,
        logits_to_keep: bool,
        graph: bool,
        fused: FusedLlama | None = None,
    ) -> None:
        B, C = bucket
        n_layers, heads, head_dim = kv_shape
        self.model = model
        self.bucket = bucket
        self.kv = torch.zeros((n_layers, 2, B, heads, C, head_dim), dtype=dtype, device=device)
        self.ids = torch.zeros((B, 1), dtype=torch.long, device=device)
        self.pos = torch.zeros((B, 1), dtype=torch.long, device=device)
        self._cols = torch.arange(C, device=device).view(1, C)
        self._index = self.pos.view(B, 1, 1, 1).expand(B, heads, 1, head_dim)
        self._mask = mask
        self._logits_to_keep = logits_to_keep
        #: the model's step in fewer kernels (genlm_hf.fused), or None: the model's own forward
        self.fused = fused
        #: capture the step as a CUDA graph (the decoder turns it off after a failed capture)
        self.use_graph = graph
        self.graph: Any = None
        self.out: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def _step(self) -> torch.Tensor:
        """The model on ``ids`` at ``pos`` over the buffer: ``(B, V')`` logits. Every
        tensor it reads is static; nothing in it depends on host values."""
        if self.fused is not None:
            return self.fused.step(self.ids, self.pos, self.kv, self._index)
        allowed = (self._cols <= self.pos)[:, None, None, :]  # (B, 1, 1, C)
        if self._mask == "bool":
            mask = allowed
        else:
            zero = torch.zeros((), dtype=self.kv.dtype, device=self.kv.device)
            mask = torch.where(allowed, zero, torch.finfo(self.kv.dtype).min)
        cache = DynamicCache(config=self.model.config)
        cache.layers = [
            _StaticLayer(self.kv[i, 0], self.kv[i, 1], self._index) for i in range(self.kv.shape[0])
        ]
        kwargs: dict[str, Any] = {
            "input_ids": self.ids,
            "attention_mask": mask,
            "position_ids": self.pos,
            cache_kwarg(self.model): cache,
            "use_cache": True,
        }
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.model(**kwargs).logits[:, -1]

    def run(self, tokens: Sequence[int], positions: Sequence[int], pad_id: int) -> torch.Tensor:
        """Row ``i`` runs token ``tokens[i]`` at position and column ``positions[i]``; the
        logits of the ``len(tokens)`` rows (a view of the static output on CUDA: read it
        before the slot runs again)."""
        B = self.bucket[0]
        n = len(tokens)
        pad = B - n
        # queued behind the device's work (no wait): the bytes are staged at once
        self.ids.copy_(
            torch.tensor([*tokens, *[pad_id] * pad], dtype=torch.long).view(B, 1), non_blocking=True
        )
        self.pos.copy_(torch.tensor([*positions, *[0] * pad], dtype=torch.long).view(B, 1), non_blocking=True)
        if not self.use_graph:
            return self._step()[:n]
        if self.graph is None:
            self._capture()
        else:
            self.graph.replay()
        return self.out[:n]  # type: ignore[index]

    def _capture(self) -> None:
        """Warm up on a side stream (twice: idempotent, each run writes the same KV), then
        capture the step; the capture's replay computes this step."""
        side = torch.cuda.Stream(device=self.kv.device)
        side.wait_stream(torch.cuda.current_stream(self.kv.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream(self.kv.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine captures in its worker thread while the program's thread may
        # copy rows off the device; "global" would break the capture on such a call
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.out = self._step()
        self.graph = graph
        graph.replay()


class _Lease:
    """A batch's hold on a slot; given back to the pool once (when its batch is dropped)."""

    def __init__(self, pool: "StaticDecoder", slot: StaticSlot) -> None:
        self.pool = pool
        self.slot: StaticSlot | None = slot

    def swap(self, slot: StaticSlot) -> None:
        old, self.slot = self.slot, slot
        if old is not None:
            self.pool.give_back(old)

    def release(self) -> None:
        old, self.slot = self.slot, None
        if old is not None:
            self.pool.give_back(old)


@dataclass(eq=False)
class StaticBatch:
    """A kept decode batch in a slot: ``lengths[i]`` tokens of row ``i``'s context are in
    columns ``[0, lengths[i])``."""

    lease: _Lease
    lengths: list[int] = field(default_factory=list)

    @property
    def slot(self) -> StaticSlot:
        assert self.lease.slot is not None
        return self.lease.slot


class StaticDecoder:
    """The slots of one engine, pooled by bucket within ``max_bytes`` (see the module doc)."""

    def __init__(
        self,
        model: Any,
        *,
        batch_size: int,
        max_bytes: int,
        graph: bool,
        logits_to_keep: bool,
        pad_id: int,
        mask: str,
        max_columns: int | None,
        strict: bool = False,
        fused: FusedLlama | None = None,
        fused_off: str | None = None,
    ) -> None:
        self.model = model
        #: the fused step new slots run (genlm_hf.fused), and why there is none
        self.fused = fused
        self.fused_off = fused_off
        self._fused_ran = False  # a fused step ran: a later failure is no fallback's business
        self.strict = strict  # a capture that fails raises (static_decode="on"), else runs without graphs
        self.batch_size = batch_size
        self.max_bytes = max_bytes
        self.graph = graph
        self.logits_to_keep = logits_to_keep
        self.pad_id = pad_id
        self.mask = mask
        self.max_columns = max_columns
        self._free: OrderedDict[int, StaticSlot] = OrderedDict()  # least recently used first
        self._busy_bytes = 0
        self.steps = 0  # steps run on the static path
        self.joined = 0  # batches copied in from the eager path
        self.moved = 0  # batches moved to a longer bucket
        self.refused = 0  # batches left on the eager path (no room)
        self.captured = 0  # graphs captured
        self.capture_failed = 0  # captures that failed (graphs then turned off)
        self._kv_layout: KVLayout | None = None

    # ------------------------------------------------------------------ the pool
    @property
    def nbytes(self) -> int:
        """Bytes of every slot's buffer, in use or free."""
        return self._busy_bytes + sum(s.nbytes for s in self._free.values())

    def _slot(self, bucket: tuple[int, int], like: torch.Tensor) -> StaticSlot | None:
        return self.slot(bucket, _layout_of(like))

    def slot(self, bucket: tuple[int, int], layout: "KVLayout", force: bool = False) -> StaticSlot | None:
        """A slot of ``bucket`` for KV of ``layout``: a free one of that bucket, else a new
        one within ``max_bytes`` (free slots dropped least recently used first); None when
        there is no room, unless ``force`` (a batch that must go on: the bound is passed
        until it ends)."""
        n_layers, heads, head_dim, dtype, device = layout
        for key, slot in self._free.items():
            if (
                slot.bucket == bucket
                and slot.kv.dtype == dtype
                and slot.kv.device == device
                and slot.fused is self.fused
            ):
                del self._free[key]
                self._busy_bytes += slot.nbytes
                return slot
        need = n_layers * 2 * bucket[0] * heads * bucket[1] * head_dim * dtype.itemsize
        while self._free and self.nbytes + need > self.max_bytes:
            self._free.popitem(last=False)
        if self.nbytes + need > self.max_bytes and not force:
            self.refused += 1
            return None
        slot = StaticSlot(
            self.model,
            bucket,
            (n_layers, heads, head_dim),
            dtype,
            device,
            self.mask,
            self.logits_to_keep,
            self.graph,
            self.fused,
        )
        self._busy_bytes += slot.nbytes
        return slot

    def kv_layout(self) -> "KVLayout":
        """The model's KV layout ``(n_layers, kv_heads, head_dim, dtype, device)``, read once
        from the cache of a one-token pass (whatever the architecture names them)."""
        if self._kv_layout is None:
            device = self.model.device
            with torch.inference_mode():
                cache = output_cache(
                    self.model(
                        input_ids=torch.full((1, 1), self.pad_id, dtype=torch.long, device=device),
                        use_cache=True,
                    )
                )
            keys = cache.layers[0].keys
            self._kv_layout = (len(cache.layers), keys.shape[1], keys.shape[3], keys.dtype, keys.device)
        return self._kv_layout

    def give_back(self, slot: StaticSlot) -> None:
        """A batch is done with ``slot``: pooled, or dropped when the slots are over the
        bound (after a move past it, :meth:`_move`)."""
        over = self.nbytes > self.max_bytes
        self._busy_bytes -= slot.nbytes
        if not over:
            self._free[id(slot)] = slot

    def clear(self) -> None:
        """Drop the free slots (the busy ones go when their batches do)."""
        self._free.clear()

    def unfuse(self, why: str) -> None:
        """New slots run the model's own forward from now on (an adapter was loaded: the
        fused step reads the base weights only); the pooled slots are dropped."""
        if self.fused is not None:
            self.fused, self.fused_off = None, why
            self.clear()

    # ------------------------------------------------------------------ batches
    def keep(self, rows: list[Row], slots: Slots) -> StaticBatch | None:
        """Copy the rows of an eager pass (:func:`genlm_hf.kv.run_rows`' buffer) into a
        slot; None when no slot fits (the caller keeps them its own way)."""
        buf, P = slots.buf, slots.filled
        assert buf is not None
        lengths = [len(r.ctx) for r in rows]
        C = column_bucket(max(lengths) + 1, self.max_columns)
        if C is None:
            return None
        slot = self._slot((batch_bucket(len(rows), self.batch_size), C), buf)
        if slot is None:
            return None
        for i, r in enumerate(rows):
            slot.kv[:, :, i, :, : lengths[i]].copy_(buf[:, :, i, :, P - r.depth : P + lengths[i] - r.depth])
        lease = _Lease(self, slot)
        batch = StaticBatch(lease, lengths)
        weakref.finalize(batch, lease.release)
        self.joined += 1
        return batch

    def resume(self, batch: StaticBatch, tokens: list[int]) -> torch.Tensor:
        """One new token per row (``tokens[i]`` after row ``i``'s context): the rows'
        logits ``(n, V')``."""
        need = max(batch.lengths) + 1
        if need > batch.slot.bucket[1]:
            self._move(batch, need)
        logits = self.run(batch.slot, tokens, batch.lengths)
        batch.lengths = [n + 1 for n in batch.lengths]
        return logits

    def run(self, slot: StaticSlot, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """:meth:`StaticSlot.run`, captured on its first step where graphs are on; a capture
        the model cannot take (a host sync in its code, say) turns graphs off for every
        slot and the step runs without one, unless ``static_decode="on"`` (it raises)."""
        if slot.use_graph and not self.graph:  # graphs turned off since this slot was made
            slot.use_graph = False
        fresh = slot.use_graph and slot.graph is None
        try:
            logits = slot.run(tokens, positions, self.pad_id)
        except Exception as exc:  # noqa: BLE001 - a model the capture cannot take
            if slot.fused is not None and not self._fused_ran:
                # the fused step never ran here (an op this torch or device lacks): the
                # model's own forward takes the static step, still captured
                note(
                    f"hf: the fused decode step failed on its first step ({exc!r}); the static step "
                    "runs the model's own forward from now on (fused_decode=False skips it)",
                    advice=True,
                )
                self.unfuse(f"its first step failed: {exc!r}")
                slot.fused, slot.graph = None, None
                return self.run(slot, tokens, positions)  # idempotent: the same KV again
            if not fresh or self.strict:
                raise
            # a warning: every later step of this engine then launches its kernels from the host
            note(
                f"hf: the static decode step could not be captured ({exc!r}); it runs without CUDA "
                "graphs from now on, much slower on a GPU (static_decode='on' raises instead)",
                advice=True,
            )
            self.capture_failed += 1
            self.graph = False
            for s in [slot, *self._free.values()]:
                s.use_graph = False
            logits = slot.run(tokens, positions, self.pad_id)  # idempotent: the same KV again
            fresh = False
        self.captured += fresh
        self.steps += 1
        self._fused_ran = self._fused_ran or slot.fused is not None
        return logits

    def _move(self, batch: StaticBatch, need: int) -> None:
        old = batch.slot
        C = column_bucket(need, self.max_columns)
        if C is None:
            raise RuntimeError(
                f"hf: a decode batch's context reached {need} tokens, past the model's "
                f"{self.max_columns} positions (max_position_embeddings)"
            )
        # no room: the batch must go on, so the bound is passed until it ends
        slot = self.slot((old.bucket[0], C), _layout_of(old.kv), force=True)
        assert slot is not None
        width = old.bucket[1]
        slot.kv[..., :width, :].copy_(old.kv)
        batch.lease.swap(slot)
        self.moved += 1

    def row_kv(self, batch: StaticBatch, i: int, depth: int, copy: bool) -> torch.Tensor:
        view = batch.slot.kv[:, :, i, :, :depth]
        return view.clone(memory_format=torch.contiguous_format) if copy else view

    def stats(self) -> dict[str, Any]:
        return {
            "static_steps": self.steps,
            "static_joined": self.joined,
            "static_moved": self.moved,
            "static_refused": self.refused,
            "static_captured": self.captured,
            "static_capture_failed": self.capture_failed,
            "static_bytes": self.nbytes,
            "fused_decode": self.fused is not None,
            "fused_decode_off": self.fused_off,
            "fused_attention": self.fused.attention if self.fused is not None else None,
        }


#: ``(n_layers, kv_heads, head_dim, dtype, device)`` of a model's KV
KVLayout = tuple[int, int, int, torch.dtype, torch.device]


def _layout_of(buf: torch.Tensor) -> KVLayout:
    """The layout of a batch buffer ``[n_layers, 2, B, kv_heads, C, head_dim]``."""
    return buf.shape[0], buf.shape[3], buf.shape[5], buf.dtype, buf.device
