"""The core conformance kit on real llama.cpp (CPU), on the tiny Llama's f32 GGUF.

The rows compared (batched / one at a time / cached / uncached) come from the same
float32 weights and KV entries; only the order of float32 sums differs between
llama.cpp's batch shapes: the kit's derived bound (``atol`` None,
:mod:`genlm_core.testing.tolerance`: the GGUF's width and depth, float32, each row's
magnitude). The batch-invariant class is exact (``atol = 0.0``).
"""

from __future__ import annotations

import pytest

import genlm_core
from genlm_core.testing import LogprobBackendConformance


class TestLlamaCppConformance(LogprobBackendConformance):
    @pytest.fixture(scope="class")
    def backend(self, tiny_gguf):
        llm = genlm_core.load("llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2)
        yield llm
        llm.close()


class TestLlamaCppConformanceSmallBudgets(LogprobBackendConformance):
    """Four KV sequences (two per group), 3-token decodes, a 24-token prefix budget and
    no output cache: constant eviction, split decodes and chunked batches."""

    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, tiny_gguf):
        llm = genlm_core.load(
            "llamacpp",
            model=str(tiny_gguf),
            kv_cache_type="f32",
            n_threads=2,
            n_seq_max=4,
            n_batch=3,
            kv_cache_tokens=24,
            cache_size=0,
            batch_size=3,
        )
        yield llm
        llm.close()


class TestLlamaCppConformanceNoPrefixCache(LogprobBackendConformance):
    @pytest.fixture(scope="class")
    def backend(self, tiny_gguf):
        llm = genlm_core.load(
            "gguf", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2, kv_cache_tokens=0, cache_size=0
        )
        yield llm
        llm.close()


class TestLlamaCppConformanceQuantised(LogprobBackendConformance):
    """The embedded SmolLM2 Q4_1 GGUF with ``batch_invariant=True``: every context computed
    alone in an emptied KV cache, so every comparison of the kit is exact."""

    atol = 0.0
    n_contexts = 4
    loop_steps = 4
    # every context computed alone from position 0: the limit check's contexts kept short
    # (its limit, 4,095 tokens, is refused all the same)
    limit_context_max = 16

    @pytest.fixture(scope="class")
    def backend(self, smollm2_gguf):
        llm = genlm_core.load("llamacpp", model=str(smollm2_gguf), n_threads=2, batch_invariant=True)
        yield llm
        llm.close()
