"""The genlm-mock tests (the conformance kit on the mock backend)."""

import pytest

from genlm_core.testing.plugin import mark_directory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """float32 numeric suites: scripts/test.sh runs them again with the SIMD path capped."""
    mark_directory(items, __file__, pytest.mark.numeric)
