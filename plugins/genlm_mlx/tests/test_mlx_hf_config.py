"""genlm-mlx reads a transformers-5 ``config.json`` as transformers does (or refuses).

transformers 5 ``save_pretrained`` keeps ``rope_theta`` under ``rope_parameters``;
mlx-lm 0.32 reads only a top-level ``rope_theta`` and silently falls back to 10000.
The oracle is transformers itself on the same folder.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import genlm_core
from genlm_core.config import ConfigError
from genlm_core.testing.tolerance import assert_tiny_close

# 60 tokens: late positions, where RoPE frequencies of different thetas diverge
CONTEXTS = [[5], [17, 300, 41, 7], [(i * 37 + 11) % 1000 + 3 for i in range(60)]]


def _mlx_vs_hf(folder, oracle_factory) -> None:
    """mlx on ``folder`` against transformers on it: the same float32 network through
    other kernels, within the derived bound (a misread rope_theta is ~1e-1 off)."""
    llm = genlm_core.load("mlx", model=str(folder), dtype="float32", cache_size=0)
    try:
        oracle = oracle_factory(folder)
        for c in CONTEXTS:
            assert_tiny_close(
                llm.next_token_logprobs_sync(c), oracle.logprobs(c), f"mlx against transformers, {c}"
            )
    finally:
        llm.close()


def test_transformers5_rope_theta_is_honoured(tiny_llama_path, tmp_path, oracle_factory):
    from genlm_core.testing import models as model_paths

    folder = model_paths.transformers5_copy(tiny_llama_path, tmp_path / "t5", rope_theta=50000.0)
    before = (folder / "config.json").read_bytes()
    _mlx_vs_hf(folder, oracle_factory)
    assert (folder / "config.json").read_bytes() == before  # the user's folder is not written


def test_gpt2_without_n_ctx_loads_as_transformers_reads_it(tiny_gpt2_path, tmp_path, oracle_factory):
    """transformers 5 no longer writes GPT-2's ``n_ctx`` (mlx-lm requires it): it is ``n_positions``."""
    folder = tmp_path / "gpt2"
    shutil.copytree(tiny_gpt2_path, folder)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["n_ctx"]
    (folder / "config.json").write_text(json.dumps(cfg))
    _mlx_vs_hf(folder, oracle_factory)


def test_unimplemented_rope_type_is_refused(tiny_llama_path, tmp_path):
    from genlm_core.testing import models as model_paths

    folder = model_paths.transformers5_copy(
        tiny_llama_path, tmp_path / "t5p", rope_type="proportional", partial_rotary_factor=0.5
    )
    with pytest.raises(ConfigError, match="rope_type='proportional'"):
        genlm_core.load("mlx", model=str(folder))


def test_per_layer_rope_is_refused(tmp_path):
    from genlm_mlx.hf_config import UnsupportedConfigError, mlx_overrides

    config = {
        "model_type": "llama",
        "layer_types": ["full_attention", "sliding_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }
    with pytest.raises(UnsupportedConfigError, match="per layer type"):
        mlx_overrides(config, {"rope_theta", "rope_scaling"})


def test_overrides_follow_transformers_priority():
    """Legacy ``rope_scaling`` beats ``rope_parameters``, which beats a top-level key
    (transformers' ``convert_rope_params_to_dict``)."""
    from genlm_mlx.hf_config import mlx_overrides

    fields = {"rope_theta", "rope_scaling"}
    assert mlx_overrides({"rope_theta": 1.0, "rope_parameters": {"rope_theta": 2.0}}, fields) == {
        "rope_theta": 2.0
    }
    scaled = {"rope_type": "linear", "factor": 2.0, "rope_theta": 3.0}
    out = mlx_overrides({"rope_parameters": {"rope_theta": 2.0}, "rope_scaling": scaled}, fields)
    assert out == {"rope_theta": 3.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    assert mlx_overrides({"rope_theta": 5.0}, fields) == {}  # nothing moved: nothing to map


def test_llm_dtype_is_what_mlx_computes_in(tiny_llama_path):
    """``llm.dtype`` against the dtype of a hidden state mlx really computes."""
    import mlx.core as mx

    for requested in ("auto", "bfloat16"):
        llm = genlm_core.load("mlx", model=str(tiny_llama_path), dtype=requested)
        try:
            inner = llm.mlx_model.model  # the Llama trunk (before the head)
            hidden = inner(mx.array([[1, 2, 3]]))
            assert llm.dtype == str(hidden.dtype).removeprefix("mlx.core.")
            assert llm.dtype == ("float32" if requested == "auto" else requested)
            assert llm.next_token_logprobs_sync([1, 2, 3]).dtype == torch.float32
        finally:
            llm.close()
