"""One eager pass over the KV pool: the model's own forward, its attention reading the pool.

:func:`run_pass` turns the rows of a pass and their :class:`~genlm_hf.pass_layout.Layout`
into the tensors of a :class:`~genlm_hf.attention.PoolPass` and runs the model once:

* new tokens right-padded to the longest suffix ``S``; position ids count each row's
  real tokens (``depth + j``); padded positions write and read the pool's pad slot;
* a shared span is read as a view of the pool where its pages lie in order, else
  gathered by its slots (:func:`span_of`);
* each row's private columns are gathered and masked (causal for its new tokens, past
  its end).

Only the rows' last real positions go through the LM head where the model takes
``logits_to_keep``. A row with read-off prefixes (contexts nested in it) hands back
several positions: a hook on the LM head's input keeps exactly those
(:func:`output_positions`).

Its shapes change every call; the static step (:mod:`genlm_hf.step`) is the one-token
call in fixed shapes.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from genlm_hf.attention import PoolPass, SharedSpan, use_pool_attention
from genlm_hf.pass_layout import Layout, PassRow
from genlm_hf.pool import PAD_SLOT, KVPool

__all__ = ["device_ints", "output_positions", "run_pass", "span_of"]


def device_ints(values: list[Any], device: Any) -> torch.Tensor:
    """``values`` (ints, or lists of ints) as an int64 tensor on ``device``, copied without
    waiting for the device (from pageable memory the copy stages the bytes at once and
    queues behind the device's work)."""
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


def span_of(rows: list[PassRow], members: list[int], length: int, device: Any) -> SharedSpan:
    """The :class:`SharedSpan` of a group: a view of the pool where its columns lie at
    consecutive slots, else its slots."""
    seq = rows[members[0]].seq
    assert seq is not None
    group = device_ints(members, device)
    start = seq.contiguous_start(length)
    if start is not None:
        return SharedSpan(group, length, start=start)
    return SharedSpan(group, length, slots=device_ints(seq.slots(0, length), device))


def run_pass(
    model: Any,
    pool: KVPool,
    rows: list[PassRow],
    layout: Layout,
    *,
    pad_id: int,
    logits_to_keep: bool,
) -> torch.Tensor:
    """Run every row's new tokens (extended and laid out): the rows' next-token logits
    ``(B, V')``, each row's read-off prefixes first."""
    device = pool.layout.device
    B = len(rows)
    S = max(r.suffix for r in rows)
    spans = [span_of(rows, members, length, device) for members, length in layout.spans]
    U = layout.width
    ids, pos, write, flat = [], [], [], []
    for r, new, cols in zip(rows, layout.new, layout.private):
        s, d = r.suffix, r.depth
        ids.append(list(r.ctx[d:]) + [pad_id] * (S - s))
        pos.append(list(range(d, d + s)) + [d + s - 1] * (S - s))
        write += new + [PAD_SLOT] * (S - s)
        flat += cols + [PAD_SLOT] * (U - len(cols))
    # mask [B, 1, S, U]: private column u of row i is the row's column shared[i] + u; query j
    # sits at column depth + j (a padded query repeats the last real one)
    width = torch.tensor([len(c) for c in layout.private])
    first = torch.tensor(layout.shared)
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
        # private columns = the new tokens alone (from the row's depth, as many as it computes):
        # real query j reads columns 0..j, the top-left causal mask
        causal=S > 1 and bool(((first == depth) & (width == suffix)).all()),
    )
    kwargs: dict[str, Any] = {
        "input_ids": device_ints(ids, device),
        "position_ids": device_ints(pos, device),
        "use_cache": False,
    }
    if any(r.read_off for r in rows):
        return _run_with_read_offs(model, run, rows, kwargs, pool.layout.layers)
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
    with use_pool_attention(model, run, pool.layout.layers):
        logits = model(**kwargs).logits
    if logits.shape[1] == 1:
        return logits[:, 0]
    return logits[torch.arange(B, device=logits.device), device_ints(cols, logits.device)]


def output_positions(rows: list[PassRow]) -> tuple[list[int], list[int]]:
    """The (row, position) of every logits row a pass hands back: each row's read-off
    prefixes (shortest first), then the row itself."""
    which, where = [], []
    for i, r in enumerate(rows):
        for n in [*r.read_off, len(r.ctx)]:
            if not r.depth < n <= len(r.ctx):
                raise ValueError(f"a prefix of {n} tokens is not run by a row from column {r.depth}")
            which.append(i)
            where.append(n - 1 - r.depth)
    return which, where


def _run_with_read_offs(
    model: Any, run: PoolPass, rows: list[PassRow], kwargs: dict[str, Any], layers: int
) -> torch.Tensor:
    """A pass that hands back several positions of some rows: the hidden states of exactly
    those positions go through the LM head (a hook on its input), not every position of
    every row."""
    which, where = output_positions(rows)
    device = kwargs["input_ids"].device
    rows_at, cols_at = device_ints(which, device), device_ints(where, device)
    head = model.get_output_embeddings()
    if head is None:  # no LM head module to gather before: every position's logits
        with use_pool_attention(model, run, layers):
            logits = model(**kwargs).logits
        return logits[rows_at.to(logits.device), cols_at.to(logits.device)]

    def gather(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        return (hidden[rows_at, cols_at].unsqueeze(0), *args[1:])

    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        # every position reaches the hook, which keeps the wanted ones
        kwargs = {**kwargs, "logits_to_keep": 0}
    handle = head.register_forward_pre_hook(gather)
    try:
        with use_pool_attention(model, run, layers):
            logits = model(**kwargs).logits
    finally:
        handle.remove()
    return logits[0]
