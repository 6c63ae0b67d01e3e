"""One checkpoint, the same answers on every engine (genlm_core.engine.checkpoint's policy).

The tiny Llama folder and the SmolLM2 folder are loaded on genlm-hf, genlm-vllm (the
session's engines), genlm-mlx and genlm-llamacpp (the GGUF the folder is converted
from, or converted from the folder): each reports the same default EOS ids and the
same context limit. Independent oracle: the values read by hand from the folder's
generation_config.json / config.json (not through genlm_core.engine.checkpoint).

The vLLM engines here are started with ``max_model_len`` (256 for the tiny Llama, 512
for SmolLM2): an engine option may lower the limit, so vLLM's is
``min(checkpoint limit, max_model_len - 1)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import genlm_core


def _by_hand(folder: str) -> tuple[list[int], int]:
    """EOS ids and context limit of ``folder`` read from its files directly."""
    gen = json.loads((Path(folder) / "generation_config.json").read_text())
    config = json.loads((Path(folder) / "config.json").read_text())
    eos = gen["eos_token_id"]
    return sorted(eos if isinstance(eos, list) else [eos]), config["max_position_embeddings"] - 1


def _facts(name: str, model: str, **options: Any) -> tuple[list[int], int | None]:
    llm = genlm_core.load(name, model=model, **options)
    try:
        return list(llm.eos_token_ids), llm.max_context_length
    finally:
        llm.close()


def test_tiny_llama_same_eos_and_context_limit_on_every_engine(tiny_path: str, tiny_backend) -> None:
    from genlm_llamacpp.convert import tiny_gguf_path

    eos, limit = _by_hand(tiny_path)
    assert limit == 255  # 256 positions: the predicted token needs one too
    facts = {
        "vllm": (tiny_backend.eos_token_ids, tiny_backend.max_context_length),
        "hf": _facts("hf", tiny_path),
        "mlx": _facts("mlx", tiny_path),
        "llamacpp": _facts("llamacpp", str(tiny_gguf_path("llama"))),
    }
    for engine, got in facts.items():
        assert got == (eos, limit), (engine, got, (eos, limit))


def test_smollm2_same_eos_and_context_limit_on_every_engine(smol_path: str, smol_backend) -> None:
    from genlm_core import models

    eos, limit = _by_hand(smol_path)
    assert limit == 8191
    facts = {
        "hf": _facts("hf", smol_path),
        "mlx": _facts("mlx", smol_path),
        # the Q4_1 GGUF the folder is converted from; n_ctx: room for the whole limit
        "llamacpp": _facts("llamacpp", str(models.smollm2_gguf_path()), n_ctx=limit + 1),
    }
    for engine, got in facts.items():
        assert got == (eos, limit), (engine, got, (eos, limit))
    # max_model_len=512 (the session engine's option) lowers vLLM's limit to 511
    assert smol_backend.eos_token_ids == eos
    assert smol_backend.max_context_length == min(limit, 512 - 1)
