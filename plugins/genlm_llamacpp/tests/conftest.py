"""Fixtures of the genlm-llamacpp tests: real llama.cpp (CPU) on GGUF files of the test models."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

import model_paths  # noqa: E402


class HFOracle:
    """A plain transformers float32 forward pass: the reference distribution."""

    def __init__(self, path: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        self.model.eval()

    def logprobs(self, context: list[int] | tuple[int, ...]):
        torch = self.torch
        with torch.no_grad():
            logits = self.model(torch.tensor([list(context)])).logits[0, -1].float()
        return torch.log_softmax(logits, dim=-1)


@pytest.fixture(scope="session")
def tiny_llama_path() -> Path:
    return model_paths.tiny_llama()


@pytest.fixture(scope="session")
def tiny_gguf() -> Path:
    """The tiny Llama as an f32 GGUF, written by llama.cpp's converter (offline)."""
    from genlm_llamacpp.convert import tiny_gguf_path

    return tiny_gguf_path("llama", "f32")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return model_paths.smollm2()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from genlm_core.embedded import smollm2_gguf_path

    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def oracle_factory():
    cache: dict[Path, HFOracle] = {}

    def get(path: Path) -> HFOracle:
        if path not in cache:
            cache[path] = HFOracle(path)
        return cache[path]

    return get
