"""Fixtures of the genlm-llamacpp tests: real llama.cpp (CPU) on GGUF files of the test models.

``tiny_llama_path``, ``tiny_gpt2_path``, ``smollm2_path`` and ``oracle_factory`` come
from genlm-core's pytest plugin (``genlm_core.testing``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from genlm_core.testing.plugin import mark_directory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """llama.cpp is compiled for this host's CPU: a crash in it (a segfault in a kernel)
    must end this suite only, so scripts/test.sh runs it in a process of its own."""
    mark_directory(items, __file__, pytest.mark.native_engine)


@pytest.fixture(scope="session")
def tiny_gguf() -> Path:
    """The tiny Llama as an f32 GGUF, written by llama.cpp's converter (offline)."""
    from genlm_llamacpp.convert import tiny_gguf_path

    return tiny_gguf_path("llama", "f32")


@pytest.fixture(scope="session")
def tiny_gpt2_gguf() -> Path:
    """The tiny GPT-2 (byte-level BPE, GELU, learned positions) as an f32 GGUF."""
    from genlm_llamacpp.convert import tiny_gguf_path

    return tiny_gguf_path("gpt2", "f32")


@pytest.fixture(scope="session")
def tiny_spm_path() -> Path:
    """The tiny Llama with a Llama-2-style sentencepiece tokenizer (tokenizer.model)."""
    from genlm_core import models

    return models.tiny_model_path("llama-spm", progress=False)


@pytest.fixture(scope="session")
def tiny_spm_gguf() -> Path:
    from genlm_llamacpp.convert import tiny_gguf_path

    return tiny_gguf_path("llama-spm", "f32")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from genlm_core.models import smollm2_gguf_path

    return smollm2_gguf_path()
