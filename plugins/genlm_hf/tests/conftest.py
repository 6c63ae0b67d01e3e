"""Shared fixtures of the genlm-hf tests: tiny models built offline, float32 backends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hf_helpers import load_hf

from genlm_core.testing.plugin import mark_directory


@pytest.fixture(scope="session")
def tiny_llama_path() -> str:
    from genlm_core.testing import models as model_paths

    return str(model_paths.tiny_llama())


@pytest.fixture(scope="session")
def tiny_gpt2_path() -> str:
    from genlm_core.testing import models as model_paths

    return str(model_paths.tiny_gpt2())


@pytest.fixture(scope="session", params=["llama", "gpt2"])
def tiny(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A float32 backend on each tiny model (shared; tests clear its caches first)."""
    from genlm_core.testing import models as model_paths

    llm = load_hf(str(model_paths.tiny_model(request.param)))
    yield llm
    llm.close()


@pytest.fixture(scope="session")
def llama(tiny_llama_path: str) -> Iterator[Any]:
    """A shared float32 tiny-Llama backend; tests that need clean caches clear them first."""
    llm = load_hf(tiny_llama_path)
    yield llm
    llm.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """float32 numeric suites: scripts/test.sh runs them again with the SIMD path capped."""
    mark_directory(items, __file__, pytest.mark.numeric)
