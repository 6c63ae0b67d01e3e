"""Fixtures of the genlm-mlx tests: real mlx (CPU) on the offline test models.

The model fixtures (``tiny_llama_path``, ``tiny_gpt2_path``, ``smollm2_path``,
``oracle_factory``) come from genlm-core's pytest plugin (``genlm_core.testing``).
"""

import pytest

from genlm_core.testing.plugin import mark_directory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """float32 numeric suites: scripts/test.sh runs them again with the SIMD path capped."""
    mark_directory(items, __file__, pytest.mark.numeric)
