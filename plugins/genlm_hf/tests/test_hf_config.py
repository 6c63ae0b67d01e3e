"""Registration, configuration and input errors (fast: no model loads unless needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hf_helpers import load_hf

import genlm_core
from genlm_core.config import ConfigError
from genlm_core.testing.tolerance import assert_backend_close


def test_registered_with_aliases_devices_and_priority() -> None:
    rows = {r["name"]: r for r in genlm_core.list_backends()}
    hf = rows["hf"]
    assert hf["status"] == "available", hf["reason"]
    assert "transformers" in hf["aliases"]
    assert hf["devices"] == ["cuda", "mps", "cpu"]
    assert hf["priority"] == {"cuda": 50, "mps": 50, "cpu": 50}
    assert hf["distribution"] == "genlm-hf"
    assert genlm_core.resolve("transformers").name == "hf"
    schema = genlm_core.resolve("hf").load_config_class().schema_json()
    for key in (
        "gguf_file",
        "dtype",
        "device_map",
        "hf_opts",
        "bitsandbytes_opts",
        "kv_cache_bytes",
        "lora_path",
    ):
        assert key in schema


def test_light_modules_import_no_engine() -> None:
    code = (
        "import sys, genlm_core, genlm_hf, genlm_hf.plugin, genlm_hf.config; "
        "genlm_core.list_backends(); genlm_core.backend_config('hf', model='x'); "
        "bad = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_config_errors_are_clear() -> None:
    with pytest.raises(ConfigError, match="did you mean 'dtype'"):
        genlm_core.backend_config("hf", model="x", dtyp="float32")
    with pytest.raises(ConfigError, match="dtype"):
        genlm_core.backend_config("hf", model="x", dtype="float64")


def test_model_none_is_the_checkpoint_policys_default(monkeypatch, tiny_llama_path) -> None:
    """model=None loads what genlm_core.engine.checkpoint.default_model names (the embedded
    SmolLM2 on every engine; a tiny folder stands in for it here)."""
    from genlm_core.engine import checkpoint

    monkeypatch.setattr(checkpoint, "default_model", lambda gguf=False: str(tiny_llama_path))
    llm = genlm_core.load("hf")
    try:
        assert llm.config.model == str(tiny_llama_path)
    finally:
        llm.close()


def test_bitsandbytes_without_cuda_fails_before_loading(monkeypatch, tiny_llama_path) -> None:
    from genlm_core.registry import hardware

    if hardware.probe().cuda:
        pytest.skip("this machine has CUDA")
    import transformers

    def boom(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("from_pretrained was called")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    with pytest.raises(ValueError, match="bitsandbytes quantization needs a CUDA GPU"):
        load_hf(tiny_llama_path, bitsandbytes_opts={"load_in_8bit": True})


def test_unavailable_device_is_a_value_error(tiny_llama_path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="no CUDA device"):
        load_hf(tiny_llama_path, device="cuda")
    with pytest.raises(ValueError, match="expected"):
        load_hf(tiny_llama_path, device="tpu")


def test_model_facts(llama) -> None:
    llm = llama
    # 256 positions: a context holds at most 255 tokens, so the token it predicts has a
    # position too (genlm_core.engine.checkpoint's rule, the same on every engine)
    assert llm.model.config.max_position_embeddings == 256
    assert llm.max_context_length == 255
    assert len(llm.byte_vocab) == len(llm.tokenizer)
    assert str(llm.device) == "cpu"
    assert llm.model.dtype.is_floating_point and str(llm.model.dtype) == "torch.float32"


async def test_over_long_and_bad_contexts_leave_backend_healthy(llama) -> None:
    llm = llama
    good = [1, 2, 3]
    expected = llm.next_token_logprobs_sync(good)
    limit = llm.max_context_length
    with pytest.raises(ValueError, match="at most 255"):
        llm.next_token_logprobs_sync([5] * (limit + 1))
    with pytest.raises(ValueError, match="at most 255"):
        await llm.next_token_logprobs([5] * (limit + 1))
    with pytest.raises(ValueError):
        llm.cache_kv([llm.vocab_size])
    # exactly the limit works
    assert llm.next_token_logprobs_sync([5] * limit).shape == (llm.vocab_size,)
    llm.clear_cache()
    assert_backend_close(llm, llm.next_token_logprobs_sync(good), expected, "a row after bad contexts")
