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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["Row", "forward_rows", "supports_kv_reuse"]


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


def _past(model: Any, rows: list[Row], past_len: int) -> DynamicCache:
    """A batched ``DynamicCache`` holding each row's past, left-padded to ``past_len``."""
    if past_len == 0:
        return DynamicCache(config=model.config)
    example = next(r.kv for r in rows if r.kv is not None)
    n_layers = example.shape[0]
    if all(r.depth == past_len for r in rows):
        buf = torch.stack([r.kv for r in rows], dim=2)  # type: ignore[misc]
    else:
        n_layers, _, heads, _, head_dim = example.shape
        buf = example.new_zeros((n_layers, 2, len(rows), heads, past_len, head_dim))
        for i, r in enumerate(rows):
            if r.depth:
                buf[:, :, i, :, past_len - r.depth :] = r.kv
    return DynamicCache([(buf[layer, 0], buf[layer, 1]) for layer in range(n_layers)], config=model.config)


def forward_rows(
    model: Any,
    rows: list[Row],
    *,
    want_kv: bool,
    logits_to_keep: bool,
    pad_id: int = 0,
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """Run ``model`` once on every row's new tokens.

    Returns the next-token logits of each row ``(B, V')`` and, if ``want_kv``, each
    row's KV for its whole context (a fresh contiguous tensor per row).
    """
    device = model.device
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
    kwargs: dict[str, Any] = {
        "input_ids": torch.tensor(ids, dtype=torch.long, device=device),
        "attention_mask": torch.tensor(mask, dtype=torch.long, device=device),
        "position_ids": torch.tensor(pos, dtype=torch.long, device=device),
    }
    use_cache = want_kv or P > 0
    if use_cache:
        kwargs["past_key_values"] = _past(model, rows, P)
    kwargs["use_cache"] = use_cache
    last = [s - 1 for s in suffix]
    cols = last
    if logits_to_keep:  # only the rows' last positions go through the LM head
        keep = sorted(set(last))
        if keep == [S - 1]:
            kwargs["logits_to_keep"] = 1
            cols = [0] * len(rows)
        else:
            kwargs["logits_to_keep"] = torch.tensor(keep, dtype=torch.long, device=device)
            where = {k: j for j, k in enumerate(keep)}
            cols = [where[c] for c in last]
    out = model(**kwargs)
    logits = out.logits
    rows_idx = torch.arange(len(rows), device=logits.device)
    logits = logits[rows_idx, torch.tensor(cols, dtype=torch.long, device=logits.device)]
    if not want_kv:
        return logits, None
    layers = out.past_key_values.layers
    kvs: list[torch.Tensor] = []
    for i, (r, s) in enumerate(zip(rows, suffix)):
        a, b = P - r.depth, P + s
        parts = [t for layer in layers for t in (layer.keys[i, :, a:b], layer.values[i, :, a:b])]
        kv = torch.stack(parts)  # one copy: contiguous, owns exactly its bytes
        kvs.append(kv.view(len(layers), 2, *kv.shape[1:]))
    return logits, kvs
