"""genlm_core.engine.checkpoint: the rules every engine reads a checkpoint by, on hand-written
folders (the oracle is the rule stated in the module, applied by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genlm_core.engine import checkpoint


def _folder(tmp_path: Path, config: dict | None = None, generation: dict | None = None) -> str:
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return str(tmp_path)


def test_eos_ids_generation_config_then_config_then_tokenizer(tmp_path: Path) -> None:
    class Tok:
        eos_token_id = 7

    both = _folder(tmp_path, {"eos_token_id": 3}, {"eos_token_id": [9, 5, 9]})
    assert checkpoint.checkpoint_eos_ids(both, Tok(), vocab_size=100) == [5, 9]
    only_config = tmp_path / "b"
    only_config.mkdir()
    assert checkpoint.checkpoint_eos_ids(
        _folder(only_config, {"text_config": {"eos_token_id": 4}}), Tok(), 100
    ) == [4]
    nothing = tmp_path / "c"
    nothing.mkdir()
    assert checkpoint.checkpoint_eos_ids(str(nothing), Tok(), 100) == [7]
    assert checkpoint.checkpoint_eos_ids(None, Tok(), 100) == [7]
    # ids outside the vocabulary are dropped; a missing tokenizer id gives none
    assert checkpoint.default_eos_ids({"eos_token_id": [1, 150]}, None, None, vocab_size=100) == [1]
    assert checkpoint.default_eos_ids(None, None, None) == []


def test_context_limit_leaves_a_position_for_the_predicted_token() -> None:
    assert checkpoint.context_limit({"max_position_embeddings": 256}) == 255
    assert checkpoint.context_limit({"n_positions": 1024, "n_ctx": 512}) == 1023  # key order
    # a multimodal config: the language model's own section first
    assert checkpoint.context_limit({"max_position_embeddings": 99, "text_config": {"seq_length": 64}}) == 63
    assert checkpoint.context_limit({"hidden_size": 64}) is None
    assert checkpoint.context_limit({"max_position_embeddings": True}) is None  # not a count
    assert checkpoint.engine_context_limit(255, 127) == 127
    assert checkpoint.engine_context_limit(255, None) == 255
    assert checkpoint.engine_context_limit(None, None) is None


def test_read_config_of_a_folder_and_of_a_file_in_it(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"max_position_embeddings": 8})
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert checkpoint.read_config(folder) == {"max_position_embeddings": 8}
    assert checkpoint.read_config(tmp_path / "model.gguf") == {"max_position_embeddings": 8}
    assert checkpoint.read_generation_config(folder) == {}
    (tmp_path / "generation_config.json").write_text("not json")
    assert checkpoint.read_generation_config(folder) == {}


def test_model_none_is_the_embedded_smollm2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from genlm_core import models

    monkeypatch.setattr(models, "smollm2_path", lambda progress=True: tmp_path / "folder")
    monkeypatch.setattr(models, "smollm2_gguf_path", lambda: tmp_path / "x.gguf")
    assert checkpoint.default_model() == str(tmp_path / "folder")
    assert checkpoint.default_model(gguf=True) == str(tmp_path / "x.gguf")
