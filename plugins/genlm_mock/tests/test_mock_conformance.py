import pytest

import genlm_core
from genlm_core.testing import LogprobBackendConformance


class TestMockConformance(LogprobBackendConformance):
    atol = 0.0

    @pytest.fixture(scope="class")
    def backend(self):
        llm = genlm_core.load("mock")
        yield llm
        llm.close()


class TestMockConformanceSmallBatches(LogprobBackendConformance):
    """Same contract with batches of 2 and a context limit (exercises both paths)."""

    atol = 0.0

    @pytest.fixture(scope="class")
    def backend(self):
        llm = genlm_core.load("mock", batch_size=2, max_context_length=16, cache_size=0)
        yield llm
        llm.close()
