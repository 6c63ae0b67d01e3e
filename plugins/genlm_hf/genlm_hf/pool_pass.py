"""One forward pass of contexts over the KV pool.

Each row of a pass is a context whose first ``depth`` columns the pool holds already (a
:class:`~genlm_hf.pool.KVSeq` forked from a kept one) and whose ``ctx[depth:]`` the model
runs now. :func:`run_pass` lays the rows out for :class:`~genlm_hf.attention.PoolPass`:

* new tokens right-padded to the longest suffix ``S``; position ids count each row's
  real tokens (``depth + j``); padded positions write and read the pool's pad slot;
* rows whose first pages are the same page ids share a span (:func:`shared_spans`): the
  columns all of them hold in those pages, read once for the group; one row whose kept
  past is long gets a span of its own (read as a view of the pool where its pages lie in
  order, not gathered);
* the rest of each row's columns (past the span, its new tokens included) are its
  private columns, gathered and masked per row.

Only the rows' last real positions go through the LM head where the model takes
``logits_to_keep``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from genlm_hf.attention import PoolPass, SharedSpan, use_pool_attention
from genlm_hf.cache_names import output_cache
from genlm_hf.pool import PAD_SLOT, KVLayout, KVPool, KVSeq

__all__ = ["MIN_SPAN", "PassRow", "device_ints", "pages_needed", "probe_layout", "run_pass", "shared_spans"]

#: the fewest columns read as a shared span (shorter common prefixes are read per row)
MIN_SPAN = 32


@dataclass
class PassRow:
    """A context to run: ``seq`` holds its first ``depth`` columns before the pass, and
    all of them after it."""

    ctx: tuple[int, ...]
    depth: int
    seq: KVSeq
    #: slots of the new columns (filled by :func:`run_pass`)
    new: list[int] = field(default_factory=list)
    #: whether the prefix cache kept ``seq`` (else its pages are given back after the call)
    kept: bool = False

    @property
    def suffix(self) -> int:
        return len(self.ctx) - self.depth


def device_ints(values: list[Any], device: Any) -> torch.Tensor:
    """``values`` (ints, or lists of ints) as an int64 tensor on ``device``, copied without
    waiting for the device (from pageable memory the copy stages the bytes at once and
    queues behind the device's work)."""
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


def shared_spans(rows: list[PassRow], page: int, min_span: int = MIN_SPAN) -> list[tuple[list[int], int]]:
    """The groups of rows that read a span, and the span's length: rows whose kept pasts
    begin with the same page, the span being the columns every row of the group holds in
    the pages they all have in common (at least ``min_span``)."""
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        if r.depth >= min_span:
            groups.setdefault(r.seq.pages[0], []).append(i)
    out = []
    for members in groups.values():
        ref = rows[members[0]].seq.pages
        common = len(ref)
        for m in members[1:]:
            pages = rows[m].seq.pages
            n = min(common, len(pages))
            k = 0
            while k < n and pages[k] == ref[k]:
                k += 1
            common = k
        length = min(common * page, min(rows[m].depth for m in members))
        if length >= min_span:
            out.append((members, length))
    return out


def run_pass(
    model: Any,
    pool: KVPool,
    rows: list[PassRow],
    *,
    layers: int,
    pad_id: int,
    logits_to_keep: bool,
    min_span: int = MIN_SPAN,
) -> torch.Tensor:
    """Extend every row's KV by its new tokens and run them: the rows' next-token logits
    ``(B, V')``. The pool must have room for the new columns (``KVPool.reserve``)."""
    device = pool.layout.device
    P = pool.page
    for r in rows:
        if r.suffix < 1:
            raise ValueError("every row needs at least one uncached token")
        r.new = r.seq.extend(r.suffix)
    B = len(rows)
    S = max(r.suffix for r in rows)
    shared = [0] * B
    spans: list[SharedSpan] = []
    for members, length in shared_spans(rows, P, min_span):
        pages = rows[members[0]].seq.pages[: (length + P - 1) // P]
        in_order = all(pages[i] == pages[0] + i for i in range(len(pages)))
        span = SharedSpan(device_ints(members, device), length)
        if in_order:
            span.start = pages[0] * P
        else:
            span.slots = device_ints(rows[members[0]].seq.slots(0, length), device)
        spans.append(span)
        for m in members:
            shared[m] = length
    private = [r.seq.slots(shared[i], r.seq.length) for i, r in enumerate(rows)]
    U = max(map(len, private))
    ids, pos, write, flat = [], [], [], []
    for r, cols in zip(rows, private):
        s, d = r.suffix, r.depth
        ids.append(list(r.ctx[d:]) + [pad_id] * (S - s))
        pos.append(list(range(d, d + s)) + [d + s - 1] * (S - s))
        write += r.new + [PAD_SLOT] * (S - s)
        flat += cols + [PAD_SLOT] * (U - len(cols))
    # mask [B, 1, S, U]: private column u of row i is the row's column shared[i] + u; query j
    # sits at column depth + j (a padded query repeats the last real one)
    width = torch.tensor([len(c) for c in private])
    first = torch.tensor(shared)
    depth = torch.tensor([r.depth for r in rows])
    suffix = torch.tensor([r.suffix for r in rows])
    u = torch.arange(U)
    qcol = depth[:, None] + torch.minimum(torch.arange(S)[None, :], suffix[:, None] - 1)  # [B, S]
    kcol = first[:, None] + u[None, :]  # [B, U]
    allowed = (u[None, None, :] < width[:, None, None]) & (kcol[:, None, :] <= qcol[:, :, None])
    mask = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill_(~allowed, float("-inf"))
    run = PoolPass(
        pool,
        write=device_ints(write, device),
        private=device_ints(flat, device),
        mask=mask.unsqueeze(1).to(device, non_blocking=True),
        shared=spans,
    )
    kwargs: dict[str, Any] = {
        "input_ids": device_ints(ids, device),
        "position_ids": device_ints(pos, device),
        "use_cache": False,
    }
    last = [r.suffix - 1 for r in rows]
    cols = last
    if logits_to_keep:  # only the rows' last positions go through the LM head
        keep = sorted(set(last))
        if keep == [S - 1]:
            kwargs["logits_to_keep"] = 1
            cols = [0] * B
        else:
            kwargs["logits_to_keep"] = device_ints(keep, device)
            where = {k: j for j, k in enumerate(keep)}
            cols = [where[c] for c in last]
    with use_pool_attention(model, run, layers):
        logits = model(**kwargs).logits
    if logits.shape[1] == 1:
        return logits[:, 0]
    return logits[torch.arange(B, device=logits.device), device_ints(cols, logits.device)]


def probe_layout(model: Any, pad_id: int) -> KVLayout:
    """The model's KV layout, read from the cache of a one-token pass (whatever the
    architecture names its heads)."""
    device = model.device
    with torch.inference_mode():
        cache = output_cache(
            model(input_ids=torch.full((1, 1), pad_id, dtype=torch.long, device=device), use_cache=True)
        )
    keys = cache.layers[0].keys
    return KVLayout(len(cache.layers), keys.shape[1], keys.shape[3], keys.dtype, keys.device)


def pages_needed(rows: list[PassRow], page: int) -> int:
    """The most pages extending ``rows`` by their new tokens takes (a new page per
    ``page`` columns, and one more per row whose last page may be copied on write)."""
    need = 0
    for r in rows:
        full = (len(r.ctx) + page - 1) // page - (r.depth + page - 1) // page
        need += full + (1 if r.depth % page else 0)
    return need
