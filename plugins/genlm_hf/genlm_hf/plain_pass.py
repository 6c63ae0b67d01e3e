"""The plain pass: for a model whose KV the pool cannot hold, each call's contexts run whole.

A model whose cache is not plain full-attention KV (:func:`~genlm_hf.pool_probe.kv_layout_problem`),
or whose pass over the pool failed the load's self-check
(:func:`~genlm_hf.pool_probe.pool_self_check`), keeps no KV: :func:`run_plain` runs every
context of a call from its first token, right-padded in one batch of the model's own
forward. Rows stay exact; a long prompt costs its whole length every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from genlm_hf.eager_pass import device_ints

__all__ = ["run_plain"]


def run_plain(
    model: Any, contexts: Sequence[tuple[int, ...]], *, pad_id: int, logits_to_keep: bool
) -> torch.Tensor:
    """The next-token logits of ``contexts`` run whole, right-padded in one batch of the
    model's own forward (its attention mask hides the padding; positions count from 0)."""
    device = model.device
    n = max(map(len, contexts))
    ids = [list(c) + [pad_id] * (n - len(c)) for c in contexts]
    mask = [[1] * len(c) + [0] * (n - len(c)) for c in contexts]
    kwargs: dict[str, Any] = {"use_cache": False}
    logits = model(
        input_ids=device_ints(ids, device), attention_mask=device_ints(mask, device), **kwargs
    ).logits
    last = device_ints([len(c) - 1 for c in contexts], logits.device)
    return logits[torch.arange(len(contexts), device=logits.device), last]
