"""The example plugin against genlm-core's conformance kit, found through its entry
point (``pip install`` this folder next to genlm-core, then ``pytest tests``: the kit's
pytest plugin comes with genlm-core)."""

import pytest

import genlm_core
from genlm_core.testing import LogprobBackendConformance


def test_found_through_its_entry_point() -> None:
    rows = {r["name"]: r for r in genlm_core.list_backends()}
    assert rows["example-bigram"]["distribution"] == "genlm-example"
    assert rows["example-bigram"]["status"] == "available"


class TestBigramConformance(LogprobBackendConformance):
    atol = 0.0  # a table lookup: every path returns the same float32 row

    @pytest.fixture(scope="class")
    def backend(self):
        llm = genlm_core.load("example-bigram")
        yield llm
        llm.close()
