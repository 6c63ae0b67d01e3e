"""Attention over the KV pool, with a prefix that many rows share read once for all of them.

A pass (:class:`PoolPass`) runs every row's new tokens through the model; each layer's
attention (registered with transformers as :data:`NAME`, switched on for the pass only:
:func:`pool_attention`) writes the new tokens' keys and values into their slots of the
pool (:mod:`genlm_hf.pool`) and attends each query to its row's columns. A row's columns
are read in two parts:

* a **shared span**: the first ``L`` columns of a group of rows whose pages are the same
  (particles of one prompt): keys ``[kv_heads, L, head_dim]`` read once - a view of the
  pool when the pages lie in order, else one gather - and every query of every row of
  the group attends to them in one matrix product per KV head (Hydragen's shared-prefix
  attention, Juravsky et al. 2024);
* the **private columns** past the span (the row's own tokens, its new tokens
  included): gathered per row into ``[kv_heads, rows, U, head_dim]``, padded to the
  longest, masked (causal for the new tokens; past the row's end).

The two parts are one softmax: their scores take a common maximum, their weights
``exp(s - max)`` are summed over both parts and the weighted values of both divide by
that one sum - the softmax of the concatenated scores, computed without concatenating
the keys (the parts' log-sum-exps merged exactly). Scores are the model dtype's matrix
product, the softmax float32, the weights cast back to the model's dtype for the value
product: eager attention's arithmetic. Grouped-query attention uses each KV head's
columns for its query heads without copying them.

A long pass (a prompt) attends in chunks of queries, so that no score tensor exceeds
:data:`SCORE_BYTES`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from genlm_hf.pool import KVPool

__all__ = ["NAME", "PoolPass", "SharedSpan", "pool_attention", "use_pool_attention"]

#: the attention implementation's name in transformers' ``AttentionInterface``
NAME = "genlm_pool"
#: the most bytes one chunk's float32 scores take
SCORE_BYTES = 16 * 2**20

_PASS: ContextVar["PoolPass | None"] = ContextVar("genlm_hf_pool_pass", default=None)

#: torch's fused attention kernel on the CPU, which also returns each query's log-sum-exp
#: (None where this torch has none: the pass then attends with matrix products)
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@dataclass
class SharedSpan:
    """Columns ``[0, length)`` that the rows ``rows`` of a pass all hold in the same
    pages: at slots ``[start, start + length)`` of the pool (``slots`` None), or at the
    slots ``slots``."""

    rows: torch.Tensor
    length: int
    start: int = 0
    slots: torch.Tensor | None = None
    #: an additive mask ``[rows, 1, new, length]`` (0 or -inf), or None: every row reads
    #: every column (a captured step's span is padded to its bucket and masked)
    mask: torch.Tensor | None = None


class PoolPass:
    """What every layer's attention reads during one pass: the pool, the slots the new
    tokens write (``write``: ``rows x new`` of them, padded positions at the pool's pad
    slot), each row's private columns (``private``: ``rows x width`` slots, padded) and
    their additive mask (``mask``: ``[rows, 1, new, width]``, 0 or -inf), and the shared
    spans. ``causal``: every row's private columns are its new tokens and nothing else (a
    prompt computed from its first token, or past a shared span), so the mask is the
    top-left causal one for every real query: the fused kernel then skips the blocks above
    the diagonal (half a long prompt's attention) instead of reading the mask."""

    def __init__(
        self,
        pool: KVPool,
        write: torch.Tensor,
        private: torch.Tensor,
        mask: torch.Tensor,
        shared: list[SharedSpan],
        causal: bool = False,
    ) -> None:
        self.pool = pool
        self.write = write
        self.private = private
        self.mask = mask
        self.shared = shared
        self.causal = causal
        #: layers whose attention ran (each once per pass: :func:`use_pool_attention` checks)
        self.layers_run = 0

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        """Layer ``layer``'s attention: ``q`` ``[B, Hq, S, D]``, the new tokens' ``k``/``v``
        ``[B, Hk, S, D]``; returns ``[B, S, Hq, D]``."""
        self.layers_run += 1
        B, Hq, S, D = q.shape
        Hk = k.shape[1]
        G = Hq // Hk
        keys, values = self.pool.layer_kv(layer)  # [Hk, slots, D]
        keys.index_copy_(1, self.write, k.transpose(0, 1).reshape(Hk, B * S, D))
        values.index_copy_(1, self.write, v.transpose(0, 1).reshape(Hk, B * S, D))
        U = self.mask.shape[-1]
        kp = keys.index_select(1, self.private).view(Hk, B, U, D)
        vp = values.index_select(1, self.private).view(Hk, B, U, D)
        spans = [(span, *self._span_kv(span, keys, values)) for span in self.shared]
        if _FLASH is not None and q.device.type == "cpu" and all(s.mask is None for s in self.shared):
            return self._attend_flash(q, kp, vp, spans, scaling)
        qh = q.reshape(B, Hk, G, S, D).transpose(0, 1)  # [Hk, B, G, S, D]
        widest = max([U, *(s.length for s in self.shared)])
        chunk = max(1, SCORE_BYTES // max(1, 4 * Hq * B * widest))
        if chunk >= S:
            out = self._attend(qh, kp, vp, spans, self.mask, scaling)
        else:
            out = torch.cat(
                [
                    self._attend(
                        qh[:, :, :, s : s + chunk], kp, vp, spans, self.mask[:, :, s : s + chunk], scaling
                    )
                    for s in range(0, S, chunk)
                ],
                dim=3,
            )
        # [Hk, B, G, S, D] -> [B, S, Hk * G, D]
        return out.permute(1, 3, 0, 2, 4).reshape(B, S, Hq, D)

    def _attend_flash(
        self,
        q: torch.Tensor,
        kp: torch.Tensor,
        vp: torch.Tensor,
        spans: list[tuple[SharedSpan, torch.Tensor, torch.Tensor]],
        scaling: float,
    ) -> torch.Tensor:
        """:meth:`attend` on the CPU through torch's fused (flash) attention kernel, which
        never holds a score matrix and returns each query's log-sum-exp: the private
        columns (each KV head's columns repeated for its query heads, masked), then each
        span for its rows' queries (a group's G query heads and new tokens side by side,
        no mask), merged exactly by their log-sum-exps. ``[B, S, Hq, D]``."""
        B, Hq, S, D = q.shape
        Hk, _, U, _ = kp.shape
        G = Hq // Hk

        def per_query_head(x: torch.Tensor) -> torch.Tensor:  # [Hk, B, U, D] -> [B, Hq, U, D]
            return x.transpose(0, 1).unsqueeze(2).expand(B, Hk, G, U, D).reshape(B, Hq, U, D)

        if self.causal:  # the mask is top-left causal for every real query (see PoolPass)
            out, lse = _FLASH(q, per_query_head(kp), per_query_head(vp), 0.0, True, scale=scaling)
        else:
            out, lse = _FLASH(
                q, per_query_head(kp), per_query_head(vp), 0.0, False, attn_mask=self.mask, scale=scaling
            )
        if spans:
            out = out.float()
            for span, ks, vs in spans:
                n = span.rows.numel()
                # the group's queries as one sequence per KV head: [1, Hk, n * G * S, D]
                qs = (
                    q.index_select(0, span.rows)
                    .view(n, Hk, G * S, D)
                    .transpose(0, 1)
                    .reshape(1, Hk, n * G * S, D)
                )
                o, o_lse = _FLASH(qs, ks.unsqueeze(0), vs.unsqueeze(0), 0.0, False, scale=scaling)
                o = o.view(Hk, n, G * S, D).transpose(0, 1).reshape(n, Hq, S, D).float()
                o_lse = o_lse.view(Hk, n, G * S).transpose(0, 1).reshape(n, Hq, S)
                mine = lse.index_select(0, span.rows)
                both = torch.logaddexp(mine, o_lse)
                merged = out.index_select(0, span.rows) * torch.exp(mine - both)[..., None]
                merged += o * torch.exp(o_lse - both)[..., None]
                out.index_copy_(0, span.rows, merged)
                lse.index_copy_(0, span.rows, both)
            out = out.to(q.dtype)
        return out.transpose(1, 2)

    @staticmethod
    def _span_kv(
        span: SharedSpan, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if span.slots is None:
            end = span.start + span.length
            return keys[:, span.start : end], values[:, span.start : end]
        return keys.index_select(1, span.slots), values.index_select(1, span.slots)

    @staticmethod
    def _attend(
        qh: torch.Tensor,
        kp: torch.Tensor,
        vp: torch.Tensor,
        spans: list[tuple[SharedSpan, torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
        scaling: float,
    ) -> torch.Tensor:
        """Queries ``qh`` ``[Hk, B, G, S, D]`` over the private columns ``kp``/``vp``
        ``[Hk, B, U, D]`` (``mask`` ``[B, 1, S, U]``) and the spans; ``[Hk, B, G, S, D]``."""
        Hk, B, G, S, D = qh.shape
        dtype = qh.dtype
        q = qh.reshape(Hk, B, G * S, D)
        scores = (torch.matmul(q, kp.transpose(-1, -2)) * scaling).float().view(Hk, B, G, S, -1)
        scores += mask  # broadcast over heads and groups
        top = scores.amax(-1, keepdim=True)  # [Hk, B, G, S, 1]
        span_scores = []
        for span, ks, _vs in spans:
            n = span.rows.numel()
            qs = q.index_select(1, span.rows).reshape(Hk, n * G * S, D)
            ss = (torch.bmm(qs, ks.transpose(1, 2)) * scaling).float().view(Hk, n, G, S, -1)
            if span.mask is not None:  # [rows, 1, S, L] against [Hk, rows, G, S, L]
                ss += span.mask
            span_scores.append(ss)
            top.index_copy_(
                1, span.rows, torch.maximum(top.index_select(1, span.rows), ss.amax(-1, keepdim=True))
            )
        weights = torch.exp(scores - top)
        total = weights.sum(-1, keepdim=True)  # [Hk, B, G, S, 1]
        out = torch.matmul(weights.to(dtype).view(Hk, B, G * S, -1), vp).float().view(Hk, B, G, S, D)
        for (span, _ks, vs), ss in zip(spans, span_scores):
            n = span.rows.numel()
            w = torch.exp(ss - top.index_select(1, span.rows))
            total.index_add_(1, span.rows, w.sum(-1, keepdim=True))
            part = torch.bmm(w.to(dtype).view(Hk, n * G * S, -1), vs).float().view(Hk, n, G, S, D)
            out.index_add_(1, span.rows, part)
        return (out / total).to(dtype)


def pool_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over the running :class:`PoolPass`."""
    run = _PASS.get()
    if run is None:
        raise RuntimeError(
            f"hf: attention {NAME!r} ran outside a genlm-hf pool pass (the model's config kept "
            "it after a failed pass?); set model.config._attn_implementation back to 'sdpa'"
        )
    for name in ("sliding_window", "softcap"):
        if kwargs.get(name) is not None:
            raise RuntimeError(f"hf: the KV pool's attention does not implement {name}={kwargs[name]!r}")
    if scaling is None:
        scaling = float(query.shape[-1]) ** -0.5
    return run.attend(module.layer_idx, query, key, value, scaling), None


_registered = False


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, pool_attention)
        _registered = True


@contextlib.contextmanager
def use_pool_attention(model: Any, run: PoolPass, layers: int) -> Iterator[None]:
    """The model attends through ``run`` inside the block (its config's attention
    implementation switched to :data:`NAME` and back). Raises ``RuntimeError`` when the
    pass ran some layer's attention other than once (a model whose attention does not go
    through transformers' attention interface: its rows would ignore the pool)."""
    _register()
    config = model.config
    previous = config._attn_implementation
    token = _PASS.set(run)
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
        _PASS.reset(token)
    if run.layers_run != layers:
        raise RuntimeError(
            f"hf: {run.layers_run} attention calls went through the KV pool in a pass of a "
            f"{layers}-layer model; its attention does not use transformers' attention interface, "
            "so the pool cannot hold its KV (load it with prefix_cache=False)"
        )
