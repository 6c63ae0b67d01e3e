"""The genlm-core conformance kit against the real transformers engine."""

import pytest
from hf_helpers import load_hf, make_lora_adapter

from genlm_core.testing import LogprobBackendConformance


class TestHFLlamaConformance(LogprobBackendConformance):
    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, tiny_llama_path, tmp_path_factory):
        llm = load_hf(tiny_llama_path)
        type(self).lora_root = tmp_path_factory.mktemp("kit-lora")
        yield llm
        llm.close()

    def lora_adapters(self, backend):
        """Two random adapters built offline with peft (genlm-hf[lora]); None where peft is
        not installed (a wheel installed without the extra: its LoRA path cannot run)."""
        try:
            import peft  # noqa: F401
        except ImportError:
            return None
        model = backend.config.model
        return [str(make_lora_adapter(model, self.lora_root / f"a{seed}", seed)) for seed in (1, 2)]


class TestHFGPT2Conformance(LogprobBackendConformance):
    """GPT-2 (learned positions, tied head) in batches of 3 with a small KV budget."""

    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, tiny_gpt2_path):
        llm = load_hf(tiny_gpt2_path, batch_size=3, kv_cache_bytes=64 * 1024)
        yield llm
        llm.close()


class TestHFNoPrefixCacheConformance(LogprobBackendConformance):
    """Plain padded batches without KV reuse and without the output cache."""

    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, tiny_llama_path):
        llm = load_hf(tiny_llama_path, prefix_cache=False, cache_size=0)
        assert not llm.kv_reuse
        yield llm
        llm.close()


class TestHFStaticDecodeConformance(LogprobBackendConformance):
    """The decode step (genlm_hf.step; on the CPU it is off unless asked) for every call of
    one token a row, bursts included, in batches of 3 (padded to the 4-row bucket)."""

    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, tiny_llama_path):
        llm = load_hf(tiny_llama_path, batch_size=3, static_decode="on")
        assert llm.engine.step is not None
        yield llm
        llm.close()


class TestHFBFloat16StaticConformance(LogprobBackendConformance):
    """bfloat16 on the decode step, batches of 3: every comparison at the bfloat16 bound the
    kit derives (two bfloat16 paths; :func:`genlm_core.testing.tolerance.row_atol`)."""

    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, tiny_llama_path):
        llm = load_hf(tiny_llama_path, batch_size=3, dtype="bfloat16", static_decode="on")
        assert llm.engine.step is not None
        yield llm
        llm.close()
