"""One copy of a prompt's KV for every row that extends it (shared-prefix attention).

This module imports mlx at the top: only :mod:`genlm_mlx.prefill` imports it.

KV chains
---------
A KV payload is a :class:`KVChain`: the segments of a context's KV in order, each an mlx
array ``(layers, 2, kv_heads, tokens, head_dim)``. A context computed from a kept prefix
hands back the prefix's chain plus one segment, its own new tokens, so a prompt that 32
particles extend is held once (the chain's segments are the same arrays), and each
particle's step adds one token of KV. :meth:`KVChain.own_bytes` is what the engine counts
against ``kv_cache_bytes``: the last segment, the rest being counted by the kept contexts
that computed them (the core releases a kept context only once nothing kept extends it:
``KVPolicy.release`` ``"resident"``).

Shared-prefix attention
-----------------------
A batch whose rows all start with the same segments (the shared prefix, ``P`` tokens)
runs over :class:`SharedPrefixCache` layers: mlx-lm's ``BatchKVCache`` holding each row's
tokens past the prefix, plus the prefix's keys and values once, ``(1, kv_heads, P,
head_dim)``. Each layer's attention scores the queries against the shared keys (one
matmul broadcast over the rows) and against the row's own keys, and takes one softmax over
both (Hydragen's decomposition, exact: the same scores, one normaliser). The prefix is
never copied per row.

mlx-lm's attention modules call ``scaled_dot_product_attention`` from
``mlx_lm.models.base`` by name; :func:`install` wraps that name in the model's modules,
so a layer whose cache carries a shared prefix takes this path and every other call is
mlx-lm's own. Each layer counts the shared reads, so a model whose attention does not go
through that name (it would silently ignore the prefix) is caught: :func:`install`'s probe
checks it once, and every shared forward checks the counts again.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import BatchKVCache

__all__ = ["KVChain", "SharedPrefixCache", "common_prefix", "install"]

#: most float32 scores one shared-attention matmul makes (queries are split past it)
MAX_SCORES = 1 << 24
_WRAPPED = "__genlm_shared_prefix__"


class KVChain:
    """The KV of one context as segments (see the module doc); ``tokens`` in all."""

    __slots__ = ("segments", "tokens")

    def __init__(self, segments: Sequence[mx.array]) -> None:
        self.segments: tuple[mx.array, ...] = tuple(segments)
        self.tokens = sum(int(s.shape[3]) for s in self.segments)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape the whole context's KV would have (tokens on axis 3)."""
        first = self.segments[0].shape
        return (first[0], first[1], first[2], self.tokens, first[4])

    @property
    def dtype(self) -> Any:
        return self.segments[0].dtype

    def own_bytes(self) -> int:
        """The bytes of the last segment: the tokens this chain's context computed."""
        return int(self.segments[-1].nbytes) if self.segments else 0

    @property
    def nbytes(self) -> int:
        """Every segment's bytes (what the chain keeps alive, shared segments included)."""
        return sum(int(s.nbytes) for s in self.segments)

    def cut(self, depth: int) -> "KVChain":
        """The chain of the first ``depth`` tokens (a segment cut short is sliced)."""
        if depth >= self.tokens:
            return self
        out: list[mx.array] = []
        left = depth
        for seg in self.segments:
            if left <= 0:
                break
            n = int(seg.shape[3])
            out.append(seg if n <= left else seg[:, :, :, :left, :])
            left -= n
        return KVChain(out)

    def extend(self, segment: mx.array | None) -> "KVChain":
        """This chain and one more segment (``None`` or an empty one: this chain)."""
        if segment is None or int(segment.shape[3]) == 0:
            return self
        return KVChain((*self.segments, segment))

    def joined(self, start: int = 0) -> mx.array | None:
        """The segments from index ``start`` as one array (None when there are none)."""
        segs = self.segments[start:]
        if not segs:
            return None
        return segs[0] if len(segs) == 1 else mx.concatenate(segs, axis=3)


def common_prefix(chains: Sequence[KVChain | None]) -> tuple[mx.array, ...]:
    """The leading segments every chain holds (the same arrays), in order."""
    if not chains or any(c is None or not c.segments for c in chains):
        return ()
    first = chains[0].segments  # type: ignore[union-attr]
    n = len(first)
    for c in chains[1:]:
        segs = c.segments  # type: ignore[union-attr]
        k = 0
        while k < min(n, len(segs)) and segs[k] is first[k]:
            k += 1
        n = k
        if n == 0:
            break
    return first[:n]


class SharedPrefixCache(BatchKVCache):
    """mlx-lm's ``BatchKVCache`` of the rows' own tokens, plus a prefix every row shares.

    ``offset`` counts the prefix, so rotary positions continue past it; ``keys`` and the
    mask cover the rows' own tokens only; the wrapped attention reads the prefix."""

    def __init__(self, left_padding: list[int], prefix_keys: mx.array, prefix_values: mx.array) -> None:
        super().__init__(left_padding)
        self.prefix_keys = prefix_keys  # (1, kv_heads, P, head_dim)
        self.prefix_values = prefix_values
        self.offset = self.offset + int(prefix_keys.shape[2])
        self.shared_reads = 0  # attention calls that read the prefix (see install)


def _shared_attention(
    queries: mx.array, keys: mx.array, values: mx.array, cache: SharedPrefixCache, scale: float, mask: Any
) -> mx.array:
    """Softmax attention of ``queries`` over the shared prefix then the rows' own keys."""
    cache.shared_reads += 1
    b, hq, length, d = queries.shape
    hkv = keys.shape[1]
    rep = hq // hkv
    f32 = mx.float32
    pk = cache.prefix_keys.astype(f32).swapaxes(-1, -2)[:, :, None]  # (1, hkv, 1, d, P)
    pv = cache.prefix_values.astype(f32)[:, :, None]  # (1, hkv, 1, P, dv)
    own_k = keys.astype(f32).swapaxes(-1, -2)[:, :, None]  # (b, hkv, 1, d, S)
    own_v = values.astype(f32)[:, :, None]
    q = (queries.astype(f32) * scale).reshape(b, hkv, rep, length, d)
    s_len = keys.shape[2]
    if isinstance(mask, str):  # "causal": the last `length` own positions are the queries'
        mask = create_causal_mask(length, offset=s_len - length)
    if mask is not None and mask.ndim == 4:  # (b|1, 1|h, L, S) -> broadcast over (hkv, rep)
        mask = (
            mask.reshape(mask.shape[0], -1, 1, length, s_len)
            if mask.shape[1] == 1
            else (mask.reshape(mask.shape[0], hkv, rep, length, s_len))
        )
    width = int(pk.shape[-1]) + s_len
    step = max(1, MAX_SCORES // max(1, b * hq * width))
    outs = []
    for lo in range(0, length, step):
        hi = min(length, lo + step)
        qs = q[:, :, :, lo:hi]
        s_p = qs @ pk
        s_o = qs @ own_k
        if mask is not None:
            m = mask[..., lo:hi, :]
            s_o = mx.where(m, s_o, -mx.inf) if m.dtype == mx.bool_ else s_o + m.astype(f32)
        top = mx.maximum(s_p.max(axis=-1, keepdims=True), s_o.max(axis=-1, keepdims=True))
        e_p = mx.exp(s_p - top)
        e_o = mx.exp(s_o - top)
        den = e_p.sum(axis=-1, keepdims=True) + e_o.sum(axis=-1, keepdims=True)
        outs.append((e_p @ pv + e_o @ own_v) / den)
    out = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=3)
    return out.reshape(b, hq, length, -1).astype(queries.dtype)


def _wrap(original: Any) -> Any:
    def scaled_dot_product_attention(queries, keys, values, cache=None, *args, **kwargs):  # noqa: ANN001, ANN202
        if isinstance(cache, SharedPrefixCache):
            scale = kwargs["scale"] if "scale" in kwargs else args[0]
            mask = kwargs["mask"] if "mask" in kwargs else (args[1] if len(args) > 1 else None)
            sinks = kwargs.get("sinks", args[2] if len(args) > 2 else None)
            if sinks is None:
                return _shared_attention(queries, keys, values, cache, scale, mask)
            # attention sinks: the prefix joined to the rows' keys, mlx-lm's own kernel
            b = keys.shape[0]
            pk = mx.broadcast_to(cache.prefix_keys, (b, *cache.prefix_keys.shape[1:]))
            pv = mx.broadcast_to(cache.prefix_values, (b, *cache.prefix_values.shape[1:]))
            cache.shared_reads += 1
            if mask is not None and not isinstance(mask, str):
                pad = mx.ones((*mask.shape[:-1], pk.shape[2]), dtype=mask.dtype)
                mask = mx.concatenate([pad if mask.dtype == mx.bool_ else pad * 0, mask], axis=-1)
            elif isinstance(mask, str):
                mask = create_causal_mask(
                    queries.shape[2], offset=keys.shape[2] - queries.shape[2] + pk.shape[2]
                )
            keys = mx.concatenate([pk, keys], axis=2)
            values = mx.concatenate([pv, values], axis=2)
            return original(queries, keys, values, None, scale=scale, mask=mask, sinks=sinks)
        return original(queries, keys, values, cache, *args, **kwargs)

    setattr(scaled_dot_product_attention, _WRAPPED, original)
    return scaled_dot_product_attention


def install(model: Any) -> str | None:
    """Route the attention of ``model``'s modules through the shared-prefix path; returns
    why it cannot (None: it can). Idempotent; other models' calls are untouched."""
    names = {type(m).__module__ for _, m in model.named_modules()} | {type(model).__module__}
    wrapped = False
    for name in names:
        module = sys.modules.get(name)
        fn = getattr(module, "scaled_dot_product_attention", None)
        if fn is None or not callable(fn):
            continue
        if not hasattr(fn, _WRAPPED):
            module.scaled_dot_product_attention = _wrap(fn)
        wrapped = True
    if not wrapped:
        return "its attention does not call mlx-lm's scaled_dot_product_attention"
    return None


def check_reads(caches: Sequence[Any], calls: int) -> None:
    """Every shared layer read its prefix once per model call, or the results are wrong."""
    for layer, c in enumerate(caches):
        if isinstance(c, SharedPrefixCache) and c.shared_reads != calls:
            raise RuntimeError(
                f"mlx: layer {layer}'s attention read the shared prompt {c.shared_reads} times in "
                f"{calls} model calls: the model's attention bypasses mlx-lm's "
                "scaled_dot_product_attention; load with prefix_cache=False"
            )
