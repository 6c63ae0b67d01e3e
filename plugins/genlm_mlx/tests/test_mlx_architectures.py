"""Models whose caches cannot be reused: sliding-window attention and Mamba (random
weights, built in memory). Prefix caching is off with a warning; batches stay exact."""

from __future__ import annotations

import pytest

# both models are no wider (MLP 128, Mamba's inner 128) nor deeper (2 blocks) than the tiny
# test models: their derived bound covers them
from genlm_core.testing.tolerance import assert_tiny_close


def _sliding_llama():
    from mlx_lm.models import llama

    return llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=2,
            rms_norm_eps=1e-6,
            vocab_size=1024,
            head_dim=32,
            num_key_value_heads=1,
            max_position_embeddings=256,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=4,
        )
    )


def _mamba():
    from mlx_lm.models import mamba

    return mamba.Model(
        mamba.ModelArgs(
            model_type="mamba",
            vocab_size=1024,
            hidden_size=64,
            intermediate_size=128,
            state_size=8,
            num_hidden_layers=2,
            conv_kernel=4,
            use_bias=False,
            use_conv_bias=True,
            time_step_rank=8,
        )
    )


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_llama_path):
    from mlx_lm import load

    return load(str(tiny_llama_path))[1]  # 1024 tokens, like the models below


@pytest.mark.parametrize("build, problem", [(_sliding_llama, "RotatingKVCache"), (_mamba, "recurrent")])
def test_batches_are_exact_without_prefix_reuse(build, problem, tiny_tokenizer):
    import mlx.core as mx
    from genlm_mlx.engine import MLXEngine

    from genlm_core.engine import BaseLogprobBackend

    mx.random.seed(0)
    model = build()
    mx.eval(model.parameters())
    with pytest.warns(UserWarning, match="prefix caching is disabled"):
        llm = BaseLogprobBackend(
            MLXEngine(model, tiny_tokenizer, MLXEngine.config_class(prefill_step_size=3))
        )
    try:
        assert llm.prefix_cache is None and problem in llm.engine.kv_reuse_problem
        # longer than the window, mixed lengths (padding), and equal lengths (one group)
        ctxs = [list(range(5, 17)), [3, 4], [100, 200, 300, 400, 500, 600], [7, 8], [9, 10, 11, 12, 13, 14]]
        rows = llm.batch_next_token_logprobs_sync(ctxs)
        for ctx, row in zip(ctxs, rows):
            assert_tiny_close(row, llm.next_token_logprobs_uncached(ctx))
        assert llm.stats()["engine"]["tokens_reused"] == 0
    finally:
        llm.close()
