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

from genlm_mlx.shared_prefix import KVChain, SharedPrefixCache, check_reads, common_prefix, install

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
    payloads: list[KVChain | None] | None  # KV of every full context (``want_kv``)
    computed: int  # context tokens run through the model (padding excluded)
    reused: int  # context tokens whose KV came from ``pasts``
    caches: list[Any] | None = None  # the batch's caches (``keep_caches``)
    left_padding: list[int] | None = None  # row i's own tokens start at position left_padding[i]
    prefix: KVChain | None = None  # the KV every row shares, ahead of the caches (``keep_caches``)


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


def batch_cache(model: Any, left_padding: list[int], prefix: mx.array | None = None) -> list[Any] | None:
    """Batched caches that mirror ``model``'s own, or ``None`` if a layer cannot batch.

    ``prefix``: the KV ``(layers, 2, kv_heads, P, head_dim)`` every row shares, read once
    by each layer (:class:`~genlm_mlx.shared_prefix.SharedPrefixCache`; plain KVCache
    layers only)."""
    out: list[Any] = []
    for layer, c in enumerate(make_prompt_cache(model)):
        if type(c) is KVCache:
            if prefix is None:
                out.append(BatchKVCache(left_padding))
            else:
                out.append(SharedPrefixCache(left_padding, prefix[layer, 0][None], prefix[layer, 1][None]))
        elif prefix is not None:
            return None
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


def _new_segments(
    caches: list[Any], left_padding: list[int], starts: list[int], total: int, max_tokens: int | None
) -> list[mx.array | None]:
    """Row ``i``'s KV from position ``starts[i]`` to ``total`` (contiguous copies): the
    tokens it computed past its kept depth; ``None`` past ``max_tokens`` tokens."""
    kv = mx.stack([mx.stack([c.keys[..., :total, :], c.values[..., :total, :]]) for c in caches])
    return [
        None
        if max_tokens is not None and total - lo > max_tokens
        else mx.contiguous(kv[:, :, i, :, lo:total, :])
        for i, lo in enumerate(starts)
    ]


def forward(
    model: Any,
    contexts: Sequence[Sequence[int]],
    pasts: Sequence[KVChain | None] | None = None,
    prefill_step_size: int = 2048,
    want_kv: bool = False,
    max_kv_tokens: int | None = None,
    keep_caches: bool = False,
    depths: Sequence[int] | None = None,
    share: bool = False,
) -> Forward:
    """Next-token logits (float32 numpy, ``(B, V_model)``) for every context.

    ``pasts[i]`` is ``None`` or the KV chain of a prefix of ``contexts[i]``, read to
    ``depths[i]`` tokens (default: the whole chain). With ``share``, rows whose chains
    start with the same segments run over them once (shared-prefix attention,
    :mod:`genlm_mlx.shared_prefix`); rows of different prompts run as separate batches
    (one batch when ``keep_caches``: then the prompt is shared only if every row reads it).
    The rest are left-padded to a common length and prefilled together in steps of
    ``prefill_step_size``, from the first position no row has kept (rows with deeper KV
    recompute a few tokens). With ``want_kv`` each row's chain is handed back: its
    prefix's and one new segment of the tokens it computed past its depth (None where
    that segment is over ``max_kv_tokens``); with ``keep_caches`` the batch's caches,
    left padding and shared prefix (None where the batch ran without batch caches).
    """
    n = len(contexts)
    chains: list[KVChain | None] = [None] * n
    if pasts is not None:
        for i, past in enumerate(pasts):
            if past is not None:
                d = past.tokens if depths is None else depths[i]
                chains[i] = past.cut(d) if d > 0 else None
    if share and not keep_caches and n > 1:
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(chains):
            groups.setdefault(id(c.segments[0]) if c is not None else 0, []).append(i)
        if len(groups) > 1:
            return _by_group(model, contexts, chains, groups, prefill_step_size, want_kv, max_kv_tokens)
    shared = common_prefix(chains)[:1] if share else ()
    lengths = [len(c) for c in contexts]
    if len(set(lengths)) > 1 and not _padding_safe(model):
        return _by_length(model, contexts, prefill_step_size)
    prefix = KVChain(shared)
    p = prefix.tokens
    own = [ctx[p:] for ctx in contexts]
    own_depths = [0 if c is None else c.tokens - p for c in chains]
    total = max(len(c) for c in own)
    left_padding = [total - len(c) for c in own]
    caches = batch_cache(model, left_padding, prefix.joined() if p else None)
    if caches is None:  # some layer cannot batch: one row at a time, model's own cache
        if want_kv:
            raise ValueError("KV payloads need batchable KVCache layers")
        rows = [_forward_one(model, ctx, prefill_step_size) for ctx in contexts]
        return Forward(np.stack(rows), None, sum(lengths), 0)
    start = min(d + lp for d, lp in zip(own_depths, left_padding))
    if start > 0:
        tails = [None if c is None else c.joined(len(shared)) for c in chains]
        _restore(caches, tails, left_padding, start)
    tokens = mx.array([[0] * lp + list(c) for lp, c in zip(left_padding, own)], dtype=mx.int32)
    tokens = tokens[:, start:]
    calls = 0
    while tokens.shape[1] > 1:
        step = min(prefill_step_size, tokens.shape[1] - 1)
        model(tokens[:, :step], cache=caches)
        mx.eval([c.state for c in caches])
        tokens = tokens[:, step:]
        calls += 1
    logits = model(tokens, cache=caches)[:, -1, :].astype(mx.float32)
    payloads = None
    if want_kv:
        starts = [lp + d for lp, d in zip(left_padding, own_depths)]
        news = _new_segments(caches, left_padding, starts, total, max_kv_tokens)
        payloads = [
            None if seg is None else (c if c is not None else prefix).extend(seg)
            for c, seg in zip(chains, news)
        ]  # fmt: skip
    mx.eval(logits, [seg for kv in (payloads or []) if kv is not None for seg in kv.segments])
    check_reads(caches, calls + 1)
    reused = sum(p + max(start - lp, 0) for lp in left_padding)
    kept = (caches, left_padding, prefix) if keep_caches else (None, None, None)
    return Forward(to_numpy_f32(logits), payloads, sum(lengths) - reused, reused, *kept)


def _by_group(
    model: Any,
    contexts: Sequence[Sequence[int]],
    chains: list[KVChain | None],
    groups: dict[int, list[int]],
    prefill_step_size: int,
    want_kv: bool,
    max_kv_tokens: int | None,
) -> Forward:
    """Rows of different prompts (first segments) as one batch each, merged in order."""
    rows: list[np.ndarray | None] = [None] * len(contexts)
    payloads: list[KVChain | None] = [None] * len(contexts)
    computed = reused = 0
    for idx in groups.values():
        out = forward(
            model,
            [contexts[i] for i in idx],
            [chains[i] for i in idx],
            prefill_step_size,
            want_kv=want_kv,
            max_kv_tokens=max_kv_tokens,
            share=True,
        )
        computed += out.computed
        reused += out.reused
        for k, i in enumerate(idx):
            rows[i] = out.logits[k]
            if out.payloads is not None:
                payloads[i] = out.payloads[k]
    return Forward(np.stack(rows), payloads if want_kv else None, computed, reused)  # type: ignore[arg-type]


def resume(model: Any, caches: list[Any], tokens: Sequence[int]) -> np.ndarray:
    """One more token per row over a batch's kept caches (the last call of :func:`forward`
    on the next column: the same mask, positions and past). Float32 ``(B, V_model)``."""
    for c in caches:
        if isinstance(c, SharedPrefixCache):
            c.shared_reads = 0
    logits = model(mx.array([[t] for t in tokens], dtype=mx.int32), cache=caches)[:, -1, :]
    logits = logits.astype(mx.float32)
    mx.eval(logits)
    check_reads(caches, 1)
    return to_numpy_f32(logits)


def row_payload(
    caches: list[Any], i: int, first: int, depth: int, copy: bool, prefix: KVChain | None = None
) -> KVChain:
    """The KV chain of row ``i``'s first ``depth`` tokens: the batch's shared ``prefix``
    and the row's own tokens, which start at position ``first`` of the batch caches (a
    contiguous copy when ``copy``)."""
    prefix = prefix or KVChain(())
    own = depth - prefix.tokens
    if own <= 0:
        return prefix.cut(depth)
    kv = mx.stack(
        [
            mx.stack([c.keys[i, :, first : first + own, :], c.values[i, :, first : first + own, :]])
            for c in caches
        ]
    )
    return prefix.extend(mx.contiguous(kv) if copy else kv)


def sharing_problem(model: Any) -> str | None:
    """Why rows cannot share a prompt's KV in this model (None: they can): the attention
    must go through the wrapped mlx-lm function (:func:`genlm_mlx.shared_prefix.install`),
    checked once on three tokens against the rows computed without sharing."""
    problem = install(model)
    if problem is not None:
        return problem
    rows = [[1, 2, 3, 4], [1, 2, 3, 5, 6]]
    try:
        prompt = forward(model, [[1, 2, 3]], want_kv=True).payloads[0]  # type: ignore[index]
        shared = forward(model, rows, [prompt, prompt], share=True)
    except RuntimeError as exc:  # a layer never read the shared prompt
        return str(exc)
    plain = forward(model, rows)
    scale = max(1.0, float(np.abs(plain.logits).max()))
    if shared.reused != 6 or float(np.abs(shared.logits - plain.logits).max()) > 1e-2 * scale:
        return "its attention gave other scores over a shared prompt than over each row's own copy"
    return None


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
