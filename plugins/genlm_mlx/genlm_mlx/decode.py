"""genlm-mlx's decode batches: a burst step's mlx-lm batch caches kept for the next step.

The core's :class:`~genlm_core.engine.decode_batches.DecodeBatches` decides which batch
resumes, which is assembled and from what; this module runs them. An assembled batch is
one :func:`genlm_mlx.prefill.forward` pass whose ``BatchKVCache`` layers are kept; a
resumed batch runs one more token per row over them (:func:`genlm_mlx.prefill.resume`),
mlx-lm writing the new keys and values in place - what the step loop's pass over the
restored past computes, without restoring it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from genlm_core.engine.contexts import Context
from genlm_core.engine.decode_batches import KeptBatch
from genlm_mlx import prefill

__all__ = ["KeptCaches", "MLXDecodeOps"]


@dataclass
class KeptCaches:
    """A batch's mlx-lm caches; row ``i``'s context starts at ``left_padding[i]``."""

    caches: list[Any]
    left_padding: list[int]
    prefix: Any = None  # the KVChain every row shares, ahead of the caches
    #: row payloads handed out, by (row, depth, copy): rows that extend one parent get the
    #: same segments, so the batch they are assembled into reads it once
    payloads: dict[tuple[int, int, bool], Any] = field(default_factory=dict)


class MLXDecodeOps:
    """:class:`~genlm_core.engine.decode_batches.DecodeOps` over an mlx-lm model: prefills of
    ``prefill_step_size`` tokens a model call."""

    def __init__(self, model: Any, prefill_step_size: int, share: bool = False) -> None:
        self.model = model
        self.prefill_step_size = prefill_step_size
        #: whether a batch whose rows extend one prompt reads it once (shared-prefix attention)
        self.share = share

    def assemble(self, contexts: list[Context], sources: list[tuple[int, Any]]) -> tuple[Any, Any]:
        out = prefill.forward(
            self.model,
            contexts,
            [payload for _, payload in sources],
            self.prefill_step_size,
            keep_caches=True,
            depths=[depth for depth, _ in sources],
            share=self.share,
        )
        logits = torch.from_numpy(out.logits)
        if out.caches is None:  # pragma: no cover - a model whose layers cannot batch
            return logits, None
        return logits, KeptCaches(out.caches, out.left_padding, out.prefix)

    def resume(self, batch: KeptBatch, contexts: list[Context]) -> Any:
        kept: KeptCaches = batch.state
        kept.payloads.clear()  # the caches change: views of them are stale
        logits = prefill.resume(self.model, kept.caches, [c[-1] for c in contexts])
        return torch.from_numpy(logits)

    def row_kv(self, batch: KeptBatch, i: int, depth: int, copy: bool) -> Any:
        kept: KeptCaches = batch.state
        key = (i, depth, copy)
        if key not in kept.payloads:
            kept.payloads[key] = prefill.row_payload(
                kept.caches, i, kept.left_padding[i], depth, copy, kept.prefix
            )
        return kept.payloads[key]
