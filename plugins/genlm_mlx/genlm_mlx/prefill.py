"""MLX-side work of the engine: batch caches, left-padded prefill, KV payloads.

This module imports mlx at the top: only :mod:`genlm_mlx.engine` imports it, and
only when an engine is created.

A **KV payload** is the key/value state of one whole prefix, as one contiguous mlx
array of shape ``(layers, 2, kv_heads, tokens, head_dim)`` (its ``nbytes`` is
what the prefix cache counts). Payloads exist only for models whose every layer
uses a plain :class:`KVCache` (see :func:`kv_reuse_problem`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

__all__ = [
    "Forward",
    "batch_cache",
    "forward",
    "kv_reuse_problem",
    "resume",
    "row_payload",
    "to_numpy_f32",
]


class Forward(NamedTuple):
    """Result of :func:`forward`."""

    logits: np.ndarray  # (B, V_model) float32
    payloads: list[mx.array | None] | None  # KV of every full context (``want_kv``)
    computed: int  # context tokens run through the model (padding excluded)
    reused: int  # context tokens whose KV came from ``pasts``
    caches: list[Any] | None = None  # the batch's caches (``keep_caches``)
    left_padding: list[int] | None = None  # row i's context starts at position left_padding[i]


def kv_reuse_problem(model: Any) -> str | None:
    """Why the KV state of this model cannot be stored and reused (``None``: it can).

    Reuse needs every layer to keep all past keys and values (:class:`KVCache`).
    Recurrent layers (``ArraysCache``: Mamba-style state) cannot be cut at a
    prefix; rotating (sliding-window) caches drop old tokens, and with ``keep > 0``
    pin the first tokens in place, so a stored window is not a prefix's state.
    """
    kinds = sorted({_describe(c) for c in make_prompt_cache(model) if type(c) is not KVCache})
    if not kinds:
        return None
    return "its cache layers are " + ", ".join(kinds) + " (only plain KVCache layers can be reused)"


def _describe(cache: Any) -> str:
    if isinstance(cache, RotatingKVCache):
        return f"RotatingKVCache(max_size={cache.max_size}, keep={cache.keep})"
    if isinstance(cache, ArraysCache):
        return "ArraysCache (recurrent state)"
    return type(cache).__name__


def batch_cache(model: Any, left_padding: list[int]) -> list[Any] | None:
    """Batched caches that mirror ``model``'s own, or ``None`` if a layer cannot batch."""
    out: list[Any] = []
    for c in make_prompt_cache(model):
        if type(c) is KVCache:
            out.append(BatchKVCache(left_padding))
        elif isinstance(c, RotatingKVCache) and c.keep == 0:
            out.append(BatchRotatingKVCache(c.max_size, left_padding))
        elif isinstance(c, ArraysCache):
            out.append(ArraysCache(len(c.cache), left_padding=left_padding))
        else:
            return None
    return out


def to_numpy_f32(x: mx.array) -> np.ndarray:
    """float32 numpy copy; bf16/f16 are widened in mlx first (no loss of range)."""
    if x.dtype != mx.float32:
        x = x.astype(mx.float32)
    return np.array(x)


def _restore(caches: list[Any], pasts: Sequence[Any], left_padding: list[int], start: int) -> None:
    """Put the first ``start`` positions of every row into fresh BatchKVCaches.

    Row ``i`` occupies positions ``[left_padding[i], T)``; its payload fills
    ``[left_padding[i], start)`` (zeros before, which the mask hides).
    """
    ref = next(p for p in pasts if p is not None)
    n_layers, _, heads, _, dim = ref.shape
    rows = []
    for past, lp in zip(pasts, left_padding):
        take = max(start - lp, 0)
        pad = start - take
        if take == 0:
            rows.append(mx.zeros((n_layers, 2, heads, start, dim), dtype=ref.dtype))
            continue
        part = past[:, :, :, :take, :]
        rows.append(mx.pad(part, [(0, 0), (0, 0), (0, 0), (pad, 0), (0, 0)]) if pad else part)
    stacked = mx.stack(rows, axis=2)  # (layers, 2, B, heads, start, dim)
    for layer, cache in enumerate(caches):
        cache.keys = stacked[layer, 0]
        cache.values = stacked[layer, 1]
        cache._idx = start  # mlx-lm 0.32 BatchKVCache has no public setter for its write index
        cache.offset = cache.offset + start


def _payloads(
    caches: list[Any], left_padding: list[int], total: int, max_tokens: int | None
) -> list[mx.array | None]:
    """The KV payload of every row's whole context (contiguous copies); ``None`` for
    rows longer than ``max_tokens`` (they would not fit the cache's budget)."""
    kv = mx.stack([mx.stack([c.keys[..., :total, :], c.values[..., :total, :]]) for c in caches])
    return [
        None
        if max_tokens is not None and total - lp > max_tokens
        else mx.contiguous(kv[:, :, i, :, lp:total, :])
        for i, lp in enumerate(left_padding)
    ]


def forward(
    model: Any,
    contexts: Sequence[Sequence[int]],
    pasts: Sequence[Any] | None = None,
    prefill_step_size: int = 2048,
    want_kv: bool = False,
    max_kv_tokens: int | None = None,
    keep_caches: bool = False,
) -> Forward:
    """Next-token logits (float32 numpy, ``(B, V_model)``) for every context.

    Contexts are left-padded to a common length and prefilled together in steps of
    ``prefill_step_size``. ``pasts[i]`` is ``None`` or the payload of a proper
    prefix of ``contexts[i]`` (its length is the cached depth). Every row is
    computed from the first position no row has cached (rows with deeper caches
    recompute a few tokens). With ``want_kv`` the payloads of the full contexts
    (those of at most ``max_kv_tokens`` tokens) are returned too; with ``keep_caches``
    the batch's caches and left padding (None where the batch ran without batch caches).
    """
    lengths = [len(c) for c in contexts]
    if len(set(lengths)) > 1 and not _padding_safe(model):
        return _by_length(model, contexts, prefill_step_size)
    total = max(lengths)
    left_padding = [total - n for n in lengths]
    caches = batch_cache(model, left_padding)
    if caches is None:  # some layer cannot batch: one row at a time, model's own cache
        if want_kv:
            raise ValueError("KV payloads need batchable KVCache layers")
        rows = [_forward_one(model, ctx, prefill_step_size) for ctx in contexts]
        return Forward(np.stack(rows), None, sum(lengths), 0)
    start = 0
    if pasts is not None and any(p is not None for p in pasts):
        depths = [0 if p is None else int(p.shape[3]) for p in pasts]
        start = min(d + lp for d, lp in zip(depths, left_padding))
        if start > 0:
            _restore(caches, pasts, left_padding, start)
    tokens = mx.array([[0] * lp + list(c) for lp, c in zip(left_padding, contexts)], dtype=mx.int32)
    tokens = tokens[:, start:]
    while tokens.shape[1] > 1:
        n = min(prefill_step_size, tokens.shape[1] - 1)
        model(tokens[:, :n], cache=caches)
        mx.eval([c.state for c in caches])
        tokens = tokens[:, n:]
    logits = model(tokens, cache=caches)[:, -1, :].astype(mx.float32)
    payloads = _payloads(caches, left_padding, total, max_kv_tokens) if want_kv else None
    mx.eval(logits, [p for p in payloads or [] if p is not None])
    reused = sum(max(start - lp, 0) for lp in left_padding)
    kept = (caches, left_padding) if keep_caches else (None, None)
    return Forward(to_numpy_f32(logits), payloads, sum(lengths) - reused, reused, *kept)


def resume(model: Any, caches: list[Any], tokens: Sequence[int]) -> np.ndarray:
    """One more token per row over a batch's kept caches (the last call of :func:`forward`
    on the next column: the same mask, positions and past). Float32 ``(B, V_model)``."""
    logits = model(mx.array([[t] for t in tokens], dtype=mx.int32), cache=caches)[:, -1, :]
    logits = logits.astype(mx.float32)
    mx.eval(logits)
    return to_numpy_f32(logits)


def row_payload(caches: list[Any], i: int, first: int, depth: int, copy: bool) -> mx.array:
    """The KV payload of row ``i``'s first ``depth`` tokens, its context starting at
    position ``first`` of the batch caches (a contiguous copy when ``copy``)."""
    kv = mx.stack(
        [
            mx.stack([c.keys[i, :, first : first + depth, :], c.values[i, :, first : first + depth, :]])
            for c in caches
        ]
    )
    return mx.contiguous(kv) if copy else kv


def _padding_safe(model: Any) -> bool:
    """Whether left padding leaves the real rows exact: not for recurrent layers.

    mlx-lm 0.32's ``ArraysCache`` takes a ``left_padding`` but Mamba-style layers still
    fold the padding tokens into their state (measured: rows differ by up to 1.0).
    """
    return not any(isinstance(c, ArraysCache) for c in make_prompt_cache(model))


def _by_length(model: Any, contexts: Sequence[Sequence[int]], prefill_step_size: int) -> Forward:
    """Batch rows of equal length together (no padding), one group at a time."""
    groups: dict[int, list[int]] = {}
    for i, ctx in enumerate(contexts):
        groups.setdefault(len(ctx), []).append(i)
    rows: list[np.ndarray | None] = [None] * len(contexts)
    computed = 0
    for idx in groups.values():
        out = forward(model, [contexts[i] for i in idx], None, prefill_step_size)
        computed += out.computed
        for i, row in zip(idx, out.logits):
            rows[i] = row
    return Forward(np.stack(rows), None, computed, 0)  # type: ignore[arg-type]


def _forward_one(model: Any, context: Sequence[int], prefill_step_size: int) -> np.ndarray:
    cache = make_prompt_cache(model)
    tokens = mx.array([list(context)], dtype=mx.int32)
    while tokens.shape[1] > 1:
        n = min(prefill_step_size, tokens.shape[1] - 1)
        model(tokens[:, :n], cache=cache)
        mx.eval([c.state for c in cache])
        tokens = tokens[:, n:]
    logits = model(tokens, cache=cache)[0, -1, :].astype(mx.float32)
    mx.eval(logits)
    return to_numpy_f32(logits)
