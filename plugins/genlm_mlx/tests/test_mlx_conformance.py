"""The core conformance kit on real mlx (CPU), for both tiny architectures.

Batched / unbatched / cached / uncached computations are compared at the kit's derived
bound (``atol`` None, :mod:`genlm_core.testing.tolerance`); measured 0 to ~1e-6 here
(float32, same kernels, padding masked).
"""

from __future__ import annotations

import pytest

import genlm_core
from genlm_core.testing import LogprobBackendConformance


class TestMLXConformanceLlama(LogprobBackendConformance):
    @pytest.fixture(scope="class")
    def backend(self, tiny_llama_path):
        llm = genlm_core.load("mlx", model=str(tiny_llama_path))
        yield llm
        llm.close()


class TestMLXConformanceGPT2SmallBudget(LogprobBackendConformance):
    """GPT-2 (learned positions), batches of 2, tiny KV budget (constant eviction),
    prefill in steps of 3 tokens and no output cache: every path of the engine."""

    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, tiny_gpt2_path):
        llm = genlm_core.load(
            "mlx",
            model=str(tiny_gpt2_path),
            batch_size=2,
            kv_cache_bytes=20_000,
            prefill_step_size=3,
            cache_size=0,
        )
        yield llm
        llm.close()


class TestMLXConformanceNoPrefixCache(LogprobBackendConformance):
    @pytest.fixture(scope="class")
    def backend(self, tiny_llama_path):
        llm = genlm_core.load("mlx", model=str(tiny_llama_path), prefix_cache=False, cache_size=0)
        yield llm
        llm.close()
