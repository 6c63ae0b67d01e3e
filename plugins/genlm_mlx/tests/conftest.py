"""Fixtures of the genlm-mlx tests: real mlx (CPU) on the offline test models."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

import model_paths  # noqa: E402
from hf_oracle import oracle_cache  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama_path() -> Path:
    return model_paths.tiny_llama()


@pytest.fixture(scope="session")
def tiny_gpt2_path() -> Path:
    return model_paths.tiny_gpt2()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return model_paths.smollm2()


@pytest.fixture(scope="session")
def oracle_factory():
    return oracle_cache()
