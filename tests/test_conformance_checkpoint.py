"""The conformance kit's checkpoint-policy check can fail on every kind of checkpoint.

Real backends (llama.cpp on the tiny Llama's f32 GGUF, the mock) first pass the check as
loaded; then one value each is made to disagree with the checkpoint, and the check must
fail. The truth is the checkpoint's own files (the GGUF metadata, read here by the ``gguf``
package as well as by the core), never a value written into the test.
"""

from __future__ import annotations

import gguf  # llama.cpp's Python package (genlm-hf's [gguf] extra): the oracle
import pytest

import genlm_core
from genlm_core.registry import get_registry
from genlm_core.testing import LogprobBackendConformance
from genlm_core.testing.conformance import find_checkpoint


class Kit(LogprobBackendConformance):
    """The kit's checks, called directly on backends made here."""


@pytest.fixture(scope="module")
def gguf_backend():
    from genlm_llamacpp.convert import tiny_gguf_path

    llm = genlm_core.load(
        "llamacpp", model=str(tiny_gguf_path("llama", "f32")), kv_cache_type="f32", n_threads=2
    )
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def mock_backend():
    llm = genlm_core.load("mock")
    yield llm
    llm.close()


def test_a_gguf_backend_is_checked_against_its_metadata(gguf_backend, request, monkeypatch) -> None:
    source = find_checkpoint(gguf_backend)
    assert source.kind == "gguf" and source.path == gguf_backend.config.model
    fields = gguf.GGUFReader(source.path).fields
    eos = int(fields["tokenizer.ggml.eos_token_id"].contents())
    positions = int(fields["llama.context_length"].contents())
    assert gguf_backend.eos_token_ids == [eos] and gguf_backend.max_context_length == positions - 1
    Kit().test_checkpoint_policy(gguf_backend, request)

    monkeypatch.setattr(gguf_backend, "eos_token_ids", sorted({eos + 1}))
    with pytest.raises(AssertionError):
        Kit().test_checkpoint_policy(gguf_backend, request)
    monkeypatch.undo()
    # a limit above the checkpoint's positions (an engine may only lower it)
    monkeypatch.setattr(type(gguf_backend), "max_context_length", property(lambda self: positions))
    with pytest.raises(AssertionError):
        Kit().test_checkpoint_policy(gguf_backend, request)
    monkeypatch.undo()
    # dtype="auto" on an F32 file is float32; a KV cache in another precision is not "auto"
    monkeypatch.setattr(type(gguf_backend), "dtype", property(lambda self: "float16"))
    with pytest.raises(AssertionError):
        Kit().test_checkpoint_policy(gguf_backend, request)


def test_a_backend_without_checkpoint_is_checked_too(mock_backend, request, monkeypatch) -> None:
    """The mock reads no model (its registration says so): the policy's no-file answer
    applies, the tokenizer's EOS id and no limit from a checkpoint."""
    source = find_checkpoint(mock_backend)
    assert source.kind == "none" and "loads no model" in source.why
    Kit().test_checkpoint_policy(mock_backend, request)
    monkeypatch.setattr(mock_backend, "eos_token_ids", [0])  # not the tokenizer's EOS id
    assert mock_backend.tokenizer.eos_token_id != 0
    with pytest.raises(AssertionError):
        Kit().test_checkpoint_policy(mock_backend, request)


def test_an_undeclared_backend_without_model_fails_with_what_to_declare(
    mock_backend, request, monkeypatch
) -> None:
    monkeypatch.setattr(get_registry().get("backend", "mock"), "model_formats", None)
    with pytest.raises(AssertionError, match="declare model_formats"):
        Kit().test_checkpoint_policy(mock_backend, request)


def test_a_mock_lent_a_tokenizer_follows_the_folders_eos_ids(tiny_llama_path, request) -> None:
    """A folder lends the mock its tokenizer only: the EOS ids come from the folder's files
    (as the policy reads them), the mock has no positions and computes in float32."""
    from genlm_core.engine import checkpoint

    llm = genlm_core.load("mock", model=str(tiny_llama_path))
    try:
        source = find_checkpoint(llm)
        assert source.kind == "none" and source.path == str(tiny_llama_path)
        assert llm.eos_token_ids == checkpoint.checkpoint_eos_ids(
            tiny_llama_path, llm.tokenizer, llm.vocab_size
        )
        Kit().test_checkpoint_policy(llm, request)
    finally:
        llm.close()
