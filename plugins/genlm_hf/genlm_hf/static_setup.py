"""How an engine's static decode step is set up: the buffers' bound and the decoder
(:mod:`genlm_hf.static`) per the ``static_decode``, ``static_decode_bytes`` and
``fused_decode`` options."""

from __future__ import annotations

from typing import Any

import torch

from genlm_core.engine import note
from genlm_hf.fused import FusedLlama, fused_reason
from genlm_hf.static import MASKS, StaticDecoder

__all__ = ["DEFAULT_BYTES", "make_static_decoder", "static_bytes"]

#: the buffers' bound where ``static_decode_bytes`` is None, off CUDA (and at least this on it)
DEFAULT_BYTES = 2**30


def static_bytes(option: int | None, device: torch.device) -> int:
    """The static buffers' bound: ``option``, or when it is None a quarter of the CUDA
    device's free memory (at least 1 GiB; read once the model is loaded), 1 GiB elsewhere."""
    if option is not None:
        return option
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(DEFAULT_BYTES, free // 4)
    return DEFAULT_BYTES


def make_static_decoder(
    model: Any, config: Any, *, logits_to_keep: bool, pad_id: int
) -> StaticDecoder | None:
    """The engine's :class:`StaticDecoder` per ``config.static_decode`` ("auto": on CUDA
    only, captured, and without graphs if a capture fails; "on": everywhere, captured on
    CUDA, a failed capture raises; "off": none), or None. Raises ``ValueError`` for "on"
    with a model the static step cannot run."""
    mode = config.static_decode
    device = torch.device(model.device)
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return None
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in MASKS:
        if mode == "on":
            raise ValueError(
                f"static_decode='on': the model attends with {impl!r}, but the static decode step "
                f"builds masks for {sorted(MASKS)} only; load it with "
                "hf_opts={'attn_implementation': 'sdpa'} or pass static_decode='off'"
            )
        note(f"hf: static decode off (attention {impl!r} is not one of {sorted(MASKS)})")
        return None
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(
        model.config, "n_positions", None
    )
    fused, fused_off = None, "fused_decode=False"
    if getattr(config, "fused_decode", True):
        fused_off = fused_reason(model)
        if fused_off is None:
            fused = FusedLlama.build(model, getattr(config, "fused_attention", "bmm"))
    return StaticDecoder(
        model,
        batch_size=config.batch_size,
        max_bytes=static_bytes(config.static_decode_bytes, device),
        graph=device.type == "cuda",
        logits_to_keep=logits_to_keep,
        pad_id=pad_id,
        mask=MASKS[impl],
        max_columns=int(limit) if limit else None,
        strict=mode == "on",
        fused=fused,
        fused_off=fused_off,
    )
