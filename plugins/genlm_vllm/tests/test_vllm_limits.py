"""vLLM's limits as a user meets them: a KV space too small for one context of
``max_model_len`` tokens is refused at load with this backend's options (on the CPU the
space is ``VLLM_CPU_KVCACHE_SPACE`` / ``cpu_kvcache_gib``, not the ``gpu_memory_utilization``
vLLM's own message names) and the next load works; a ``max_model_len`` below the model's
window refuses longer contexts naming it, through the conformance kit's check
(:func:`genlm_core.testing.limits.check_context_limit`: the message, the calls beside the
refused one, the prefixes as from a cleared cache, a context of exactly the limit)."""

from __future__ import annotations

from typing import Any

import pytest

import genlm_core
from genlm_core.testing.limits import check_context_limit
from genlm_core.testing.tolerance import assert_rows_close, model_shape


def test_kv_space_below_one_context_then_max_model_len_below_the_window(
    tiny_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the tiny Llama's KV is 512 bytes a token: 1 GiB holds 2,097,152 tokens, vLLM's
    # estimate 2,097,024; 4M needs 1.91 GiB (vLLM refuses a length past the model's 256
    # positions unless allowed to)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    common: dict[str, Any] = {"model": tiny_path, "dtype": "float32", "enforce_eager": True}
    with pytest.raises(ValueError) as err:
        genlm_core.load("vllm", max_model_len=4_000_000, **common)
    text = str(err.value)
    assert "max_model_len=4000000" in text and "VLLM_CPU_KVCACHE_SPACE=1 GiB" in text, text
    assert "cpu_kvcache_gib" in text and "raise it" in text and "lower max_model_len" in text, text

    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    llm = genlm_core.load("vllm", max_model_len=64, cache_size=0, batch_size=8, **common)
    try:
        assert llm.max_context_length == 63

        def close(backend: Any, got: Any, want: Any, what: str) -> None:
            assert_rows_close(got, want, model_shape(backend), dtype=backend.dtype, what=what)

        ids = list(range(3, llm.vocab_size))
        check_context_limit(llm, ids, window=255, assert_close=close, at_limit_max=64)
        with pytest.raises(ValueError, match=r"64 tokens but at most 63 fit: this backend's max_model_len"):
            llm.next_token_logprobs_sync(ids[:64])
    finally:
        llm.close()
