"""Whether a model's KV can live in the pool, and in what shape.

At load the engine asks, in order:

* :func:`kv_layout_problem`: is the model's cache plain full-attention KV (no sliding
  window, no recurrent state, not encoder-decoder)? A property of the architecture;
* :func:`pool_self_check`: does a pass over the pool give the model's own row? A guard
  against an attention the pool does not implement (its result is recorded and reported
  by :mod:`genlm_hf.pool_check`);
* :func:`probe_layout`: the KV's layers, heads, head size, dtype and device, read from the
  cache of a one-token pass (the pool's shape).

A model that fails either question runs every call whole (:mod:`genlm_hf.plain_pass`).
"""

from __future__ import annotations

from typing import Any

import torch

from genlm_hf.cache_names import output_cache
from genlm_hf.eager_pass import run_pass
from genlm_hf.pass_layout import PassRow, extend_rows, lay_out
from genlm_hf.pool import KVLayout, KVPool, KVSeq

__all__ = ["kv_layout_problem", "pool_self_check", "probe_layout", "supports_kv_reuse"]


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


def supports_kv_reuse(model: Any) -> bool:
    """Whether every layer caches plain full-attention KV (no sliding window, no recurrent state)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    if getattr(model.config, "is_encoder_decoder", False):
        return False
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - unusual configs: run without KV reuse
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def kv_layout_problem(model: Any) -> str | None:
    """Why ``model``'s KV cannot live in the pool (None: it can): its cache must be plain
    full-attention KV. A property of the architecture: such a model runs every call whole."""
    if not supports_kv_reuse(model):
        return "its cache is not plain full-attention KV (sliding window, recurrent state or encoder-decoder)"
    return None


def pool_self_check(model: Any, pad_id: int) -> str | None:
    """Why a pass over the pool does not give ``model``'s own row (None: it does): a
    3-token context computed as 2 tokens, then 1 more over their kept columns, against one
    uncached pass. A guard against an attention the pool does not implement (a layer that
    does not go through transformers' attention interface, a new transformers release),
    loose enough for any dtype's rounding: a failure is a bug, never rounding."""
    try:
        layout = probe_layout(model, pad_id)
        pool = KVPool(layout, None)
        ctx = (pad_id, pad_id, pad_id)
        first = PassRow(ctx[:2], 0, KVSeq(pool))
        with torch.inference_mode():
            new = extend_rows([first])
            run_pass(model, pool, [first], lay_out([first], new), pad_id=pad_id, logits_to_keep=False)
            second = PassRow(ctx, 2, first.seq.fork())  # type: ignore[union-attr]
            new = extend_rows([second])
            got = run_pass(model, pool, [second], lay_out([second], new), pad_id=pad_id, logits_to_keep=False)
            ids = torch.tensor([list(ctx)], device=layout.device)
            want = model(input_ids=ids, use_cache=False).logits[0, -1]
    except Exception as exc:  # noqa: BLE001 - an attention the pool cannot take
        return f"a pass over the KV pool raised {type(exc).__name__}: {exc}"
    got, want = got[0].float(), want.float()
    off = float((got - want).abs().max())
    if not off <= 0.1 * (1.0 + float(want.abs().max())):
        return f"a pass over the KV pool gave logits {off:.3g} away from the model's own forward"
    return None
