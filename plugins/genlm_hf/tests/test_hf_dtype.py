"""``dtype`` on the hf backend: one meaning ("auto" = the checkpoint's dtype), and
``llm.dtype`` is what the model really computes in (a hidden state's dtype)."""

from __future__ import annotations

import json

import pytest
import torch

import genlm_core


def _hidden_dtype(llm) -> str:
    """dtype of the first decoder layer's output in a real forward pass."""
    seen: list[torch.dtype] = []
    layer = llm.model.model.layers[0]
    hook = layer.register_forward_hook(
        lambda _m, _i, out: seen.append((out[0] if isinstance(out, tuple) else out).dtype)
    )
    try:
        llm.next_token_logprobs_uncached([1, 2, 3])
    finally:
        hook.remove()
    return str(seen[0]).removeprefix("torch.")


@pytest.fixture(scope="module")
def bf16_checkpoint(tiny_llama_path, tmp_path_factory):
    """The tiny Llama saved in bfloat16 (config.json says dtype=bfloat16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("bf16")
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(tiny_llama_path).save_pretrained(str(out))
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    return str(out)


@pytest.mark.parametrize(
    ("which", "requested", "expected"),
    [
        ("f32", "auto", "float32"),
        ("bf16", "auto", "bfloat16"),
        ("bf16", "float32", "float32"),
        ("f32", "float16", "float16"),
    ],
)
def test_llm_dtype_is_what_the_model_computes_in(
    which, requested, expected, tiny_llama_path, bf16_checkpoint
) -> None:
    path = tiny_llama_path if which == "f32" else bf16_checkpoint
    llm = genlm_core.load("hf", model=path, dtype=requested, device="cpu")
    try:
        assert _hidden_dtype(llm) == expected
        assert llm.dtype == expected
        assert llm.next_token_logprobs_sync([1, 2]).dtype == torch.float32  # results stay float32
    finally:
        llm.close()


def test_old_name_torch_dtype_is_an_alias(tiny_llama_path) -> None:
    cfg = genlm_core.backend_config("hf", model=tiny_llama_path, torch_dtype=torch.bfloat16)
    assert cfg.dtype == "bfloat16"
    # genlm-backend's spelling, hf_opts={"torch_dtype": ...}, sets the dtype too; a conflict is refused
    llm = genlm_core.load("hf", model=tiny_llama_path, hf_opts={"torch_dtype": torch.float16})
    try:
        assert _hidden_dtype(llm) == llm.dtype == "float16"
    finally:
        llm.close()
    with pytest.raises(ValueError, match=r"hf_opts\['torch_dtype'\].*conflicts with dtype='float32'"):
        genlm_core.load("hf", model=tiny_llama_path, dtype="float32", hf_opts={"torch_dtype": "bfloat16"})
