"""One batched forward pass over contexts whose prefixes may have cached KV state.

Layout of a batch of ``B`` rows, row ``i`` with a cached prefix of ``d_i`` tokens and
``s_i`` new (suffix) tokens; ``P = max d_i``, ``S = max s_i``::

    KV slots:  [ pad (P - d_i) | cached past (d_i) | suffix (s_i) | pad (S - s_i) ]
                 <------------- past: P ---------> <------- new: S ------------>

The past is left-padded to a common length ``P`` (zeros, masked out), the new tokens
are right-padded to ``S``. The attention mask marks the real slots; position ids
count the real tokens only (``d_i + j``). With right-padded new tokens no real query
ever sits after a padded one, and no query row is fully masked (every row has at
least one real token before any padding), so no NaNs appear. Row ``i``'s KV for its
whole context is then the contiguous slot range ``[P - d_i, P + s_i)``.

A KV payload is one tensor ``[n_layers, 2, kv_heads, length, head_dim]`` per context.

Every slot of the batch lives in one buffer ``[n_layers, 2, B, kv_heads, P + S,
head_dim]``: each row's past is copied in once, the model's cache layers
(:class:`_SlotLayer`) write the new tokens' KV in place instead of concatenating, and
each row's payload is cut out with one copy. transformers' own ``DynamicCache``
would copy the whole past three more times per step (on construction, on every
layer's ``torch.cat``, and when the rows are split again).

The buffer is carved out of a :class:`Workspace` the backend keeps between passes
(when it is at most ``Workspace.keep_bytes``): a batch's buffer is tens of MB (64 rows of
21 tokens of SmolLM2: 62 MB), which the allocator hands out as fresh pages every pass
(glibc maps blocks above 32 MB anew), and faulting them in cost ~6% of a 64-row step on
the CPU. Nothing outlives the pass in it: every payload is copied out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from genlm_hf.cache_names import cache_kwarg

__all__ = [
    "Row",
    "Slots",
    "Workspace",
    "device_ints",
    "forward_rows",
    "resume_rows",
    "run_rows",
    "supports_kv_reuse",
]


@dataclass
class Row:
    """A context to run: ``kv`` covers ``ctx[:depth]`` (``None`` when ``depth == 0``)."""

    ctx: tuple[int, ...]
    depth: int = 0
    kv: torch.Tensor | None = None


def supports_kv_reuse(model: Any) -> bool:
    """Whether every layer caches plain full-attention KV (no sliding window, no recurrent state)."""
    if getattr(model.config, "is_encoder_decoder", False):
        return False
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - unusual configs: run without KV reuse
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


class Workspace:
    """Memory for batch KV buffers, kept from one forward pass to the next (one pass at a
    time: the backend's model lock). Blocks above ``keep_bytes`` are not kept."""

    def __init__(self, keep_bytes: int = 256 * 2**20) -> None:
        self.keep_bytes = keep_bytes
        self._block: torch.Tensor | None = None

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` with ``like``'s dtype and device."""
        numel = 1
        for n in shape:
            numel *= n
        block = self._block
        if (
            block is not None
            and block.dtype == like.dtype
            and block.device == like.device
            and block.numel() >= numel
        ):
            return block[:numel].view(shape)
        self._block = None  # the old block goes before the new one comes
        fresh = like.new_empty((numel,))
        if numel * fresh.element_size() <= self.keep_bytes:
            self._block = fresh
        return fresh.view(shape)

    def clear(self) -> None:
        self._block = None


class Slots:
    """The batch's KV buffer ``[n_layers, 2, B, heads, capacity, head_dim]``, allocated when
    the first layer reports its KV shape (or resumed: :meth:`resume`).

    The model sees columns ``[start, filled)`` of it: ``past_len = filled - start`` slots of
    past, then the new tokens' slots, written in place. ``headroom`` columns more than a
    pass needs keep the buffer for the passes after it (a decode batch,
    :mod:`genlm_hf.decode`)."""

    def __init__(
        self,
        rows: list[Row],
        past_len: int,
        new_len: int,
        workspace: Workspace | None = None,
        headroom: int = 0,
    ) -> None:
        self.rows = rows
        self.start = 0
        self.filled = past_len
        self.capacity = past_len + new_len + headroom
        self.workspace = workspace
        self.buf: torch.Tensor | None = None

    @classmethod
    def resume(cls, buf: torch.Tensor, start: int, filled: int) -> "Slots":
        """A buffer kept from an earlier pass, its past in columns ``[start, filled)``."""
        slots = cls([], 0, 0)
        slots.start, slots.filled, slots.capacity, slots.buf = start, filled, buf.shape[-2], buf
        return slots

    def allocate(self, n_layers: int, key_states: torch.Tensor) -> torch.Tensor:
        """``[n_layers, 2, B, heads, capacity, head_dim]`` holding every row's left-padded past."""
        B, heads, _, head_dim = key_states.shape
        P = self.filled
        shape = (n_layers, 2, B, heads, self.capacity, head_dim)
        buf = (
            self.workspace.take(shape, key_states)
            if self.workspace is not None
            else key_states.new_empty(shape)
        )
        for i, r in enumerate(self.rows):
            if r.depth < P:  # masked slots: any finite value works, garbage may be NaN
                buf[:, :, i, :, : P - r.depth].zero_()
            if r.depth:
                buf[:, :, i, :, P - r.depth : P].copy_(r.kv)  # type: ignore[arg-type]
        self.buf = buf
        return buf


class _SlotLayer(DynamicLayer):
    """A full-attention cache layer whose KV lives in the batch's shared buffer.

    ``keys``/``values`` are views of the slots in use (from ``slots.start``), so
    ``get_seq_length`` and the mask sizes are those of a ``DynamicLayer`` holding the
    past; ``update`` writes the new tokens' KV into the next slots in place (no
    ``torch.cat``).
    """

    def __init__(self, slots: Slots, index: int, n_layers: int) -> None:
        super().__init__()
        self._slots = slots
        self._index = index
        self._n_layers = n_layers
        self._filled = slots.filled

    def get_seq_length(self) -> int:
        return self._filled - self._slots.start

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self._slots.buf
        if buf is None:
            buf = self._slots.allocate(self._n_layers, key_states)
        start, end = self._filled, self._filled + key_states.shape[-2]
        B, heads, _, head_dim = key_states.shape
        if (B, heads, head_dim) != (buf.shape[2], buf.shape[3], buf.shape[5]) or end > buf.shape[-2]:
            raise RuntimeError(
                f"layer {self._index} caches KV of shape {tuple(key_states.shape)}, which does not fit "
                f"the batch's KV slots {tuple(buf.shape)} (layers with different KV shapes?); "
                "load the model with prefix_cache=False"
            )
        layer = buf[self._index]
        layer[0, :, :, start:end].copy_(key_states)
        layer[1, :, :, start:end].copy_(value_states)
        self._filled = end
        start = self._slots.start
        self.keys, self.values = layer[0, :, :, start:end], layer[1, :, :, start:end]
        self.dtype, self.device = buf.dtype, buf.device
        self.is_initialized = True
        return self.keys, self.values


def _slot_cache(model: Any, slots: Slots) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    n_layers = len(cache.layers)
    cache.layers = [_SlotLayer(slots, i, n_layers) for i in range(n_layers)]
    return cache


def run_rows(
    model: Any,
    rows: list[Row],
    *,
    use_cache: bool,
    logits_to_keep: bool,
    pad_id: int = 0,
    workspace: Workspace | None = None,
    headroom: int = 0,
) -> tuple[torch.Tensor, Slots | None]:
    """Run ``model`` once on every row's new tokens (the layout above).

    Returns the next-token logits of each row ``(B, V')`` and the batch's :class:`Slots`
    (None when the model ran without a cache: ``use_cache`` False and no row has a past).
    ``workspace``: where the KV buffer is carved from (none: a fresh allocation, which
    the caller may keep); ``headroom``: columns to leave free after the new tokens.
    """
    suffix = [len(r.ctx) - r.depth for r in rows]
    if min(suffix) < 1:
        raise ValueError("every row needs at least one uncached token")
    P = max(r.depth for r in rows)
    S = max(suffix)
    ids, mask, pos = [], [], []
    for r, s in zip(rows, suffix):
        d = r.depth
        ids.append(list(r.ctx[d:]) + [pad_id] * (S - s))
        mask.append([0] * (P - d) + [1] * (d + s) + [0] * (S - s))
        pos.append(list(range(d, d + s)) + [d + s - 1] * (S - s))
    slots = Slots(rows, P, S, workspace, headroom) if use_cache or P > 0 else None
    logits = _run(model, ids, mask, pos, [s - 1 for s in suffix], slots, logits_to_keep)
    if slots is not None and slots.buf is None:  # pragma: no cover - a model that never touched its cache
        raise RuntimeError(
            "the model did not write its KV cache (does its forward accept a KV cache, `cache` or `past_key_values`?)"
        )
    return logits, slots


def resume_rows(
    model: Any,
    slots: Slots,
    tokens: list[int],
    depths: list[int],
    *,
    logits_to_keep: bool,
) -> torch.Tensor:
    """One new token per row over a kept buffer (:meth:`Slots.resume`): row ``i`` has
    ``depths[i]`` tokens of past, ending at column ``slots.filled``. Returns the rows'
    next-token logits ``(B, V')``; the tokens' KV is written at column ``slots.filled``.
    The model sees what :func:`run_rows` would show it for these rows: the same mask,
    positions and past length."""
    P = slots.filled - slots.start
    ids = [[t] for t in tokens]
    mask = [[0] * (P - d) + [1] * (d + 1) for d in depths]
    pos = [[d] for d in depths]
    return _run(model, ids, mask, pos, [0] * len(tokens), slots, logits_to_keep)


def device_ints(values: list[Any], device: Any) -> torch.Tensor:
    """``values`` (ints, or lists of ints) as an int64 tensor on ``device``, copied without
    waiting for the device: from pageable memory the copy stages the bytes at once and
    queues behind the device's work, where a blocking copy would synchronise the stream
    (a step's host work after its replay is launched would then wait for the replay to
    end instead of running beside it)."""
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


def _run(
    model: Any,
    ids: list[list[int]],
    mask: list[list[int]],
    pos: list[list[int]],
    last: list[int],
    slots: Slots | None,
    logits_to_keep: bool,
) -> torch.Tensor:
    """The model on ``ids`` (right-padded new tokens) over ``slots``; the logits of each
    row at its column ``last[i]``."""
    device = model.device
    kwargs: dict[str, Any] = {
        "input_ids": device_ints(ids, device),
        "attention_mask": device_ints(mask, device),
        "position_ids": device_ints(pos, device),
    }
    if slots is not None:
        kwargs[cache_kwarg(model)] = _slot_cache(model, slots)
    kwargs["use_cache"] = slots is not None
    S = len(ids[0])
    cols = last
    if logits_to_keep:  # only the rows' last positions go through the LM head
        keep = sorted(set(last))
        if keep == [S - 1]:
            kwargs["logits_to_keep"] = 1
            cols = [0] * len(ids)
        else:
            kwargs["logits_to_keep"] = device_ints(keep, device)
            where = {k: j for j, k in enumerate(keep)}
            cols = [where[c] for c in last]
    logits = model(**kwargs).logits
    if cols == [0] * len(ids) and logits.shape[1] == 1:
        return logits[:, 0]
    rows_idx = torch.arange(len(ids), device=logits.device)
    return logits[rows_idx, device_ints(cols, logits.device)]


def forward_rows(
    model: Any,
    rows: list[Row],
    *,
    want_kv: bool,
    logits_to_keep: bool,
    pad_id: int = 0,
    workspace: Workspace | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """Run ``model`` once on every row's new tokens.

    Returns the next-token logits of each row ``(B, V')`` and, if ``want_kv``, each
    row's KV for its whole context (a fresh contiguous tensor per row). ``workspace``:
    where the batch's KV buffer is carved from (none: a fresh allocation).
    """
    logits, slots = run_rows(
        model, rows, use_cache=want_kv, logits_to_keep=logits_to_keep, pad_id=pad_id, workspace=workspace
    )
    if not want_kv:
        return logits, None
    return logits, copy_out(slots, rows)  # type: ignore[arg-type]


def copy_out(slots: Slots, rows: list[Row]) -> list[torch.Tensor]:
    """Each row's KV for its whole context, cut out of a :func:`run_rows` buffer: one copy
    per row, contiguous, owning exactly its bytes (never a view of the buffer, which the
    next pass reuses)."""
    buf, P = slots.buf, slots.filled  # type: ignore[union-attr]
    return [
        buf[:, :, i, :, P - r.depth : P + len(r.ctx) - r.depth].clone(memory_format=torch.contiguous_format)  # type: ignore[index]
        for i, r in enumerate(rows)
    ]
