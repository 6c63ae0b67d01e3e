import pytest

from genlm_core.testing import LogprobBackendConformance


class TestVLLMConformance(LogprobBackendConformance):
    """The shared contract on the tiny Llama engine (chunked prefill forced)."""

    n_contexts = 8
    max_len = 40  # longer than the 32-token step budget: some contexts are chunked

    @pytest.fixture(scope="class")
    def backend(self, tiny_backend):
        tiny_backend.clear_cache()
        return tiny_backend
