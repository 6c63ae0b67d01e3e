"""Sampling through mlx-lm (``generate_step`` + ``make_sampler``); imports mlx."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

__all__ = ["sample_tokens"]


def sample_tokens(
    model: Any,
    prompt: Sequence[int],
    max_tokens: int,
    eos: set[int],
    temperature: float,
    seed: int | None,
    vocab_size: int,
    prefill_step_size: int = 2048,
) -> list[int]:
    """Draw up to ``max_tokens`` tokens; stop before the first one in ``eos``.

    ``seed`` seeds mlx's global generator (callers hold the model lock, so no other
    draw interleaves). Scores of ids ``>= vocab_size`` (padding rows of an enlarged
    embedding matrix) are masked so they are never drawn.
    """
    if max_tokens <= 0:
        return []
    if seed is not None:
        mx.random.seed(int(seed))
    processors = []
    if _model_vocab(model, vocab_size) > vocab_size:
        processors.append(_mask_beyond(vocab_size))
    out: list[int] = []
    steps = generate_step(
        mx.array(list(prompt), dtype=mx.int32),
        model,
        max_tokens=max_tokens,
        sampler=make_sampler(temp=temperature),
        logits_processors=processors or None,
        prefill_step_size=prefill_step_size,
    )
    for token, _ in steps:
        tok = int(token)
        if tok in eos:
            break
        out.append(tok)
    return out


def _model_vocab(model: Any, default: int) -> int:
    args = getattr(model, "args", None)
    value = getattr(args, "vocab_size", None)
    return value if isinstance(value, int) else default


def _mask_beyond(vocab_size: int) -> Any:
    def process(tokens: mx.array, logits: mx.array) -> mx.array:
        ids = mx.arange(logits.shape[-1])
        return mx.where(ids < vocab_size, logits, mx.array(-mx.inf, dtype=logits.dtype))

    return process
