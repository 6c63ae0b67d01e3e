"""Shared engines for the genlm-vllm tests: vLLM engines are slow to start, so each
model gets one engine for the whole session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# in-process engine core, small CPU KV cache (the backend sets these too when unset)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

_TESTS = Path(__file__).resolve().parents[3] / "tests"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

#: tokens per engine step of the tiny engine: small, so mixed batches are chunked
TINY_BUDGET = 32


@pytest.fixture(scope="session")
def tiny_path() -> str:
    import model_paths

    return str(model_paths.tiny_llama())


@pytest.fixture(scope="session")
def tiny_backend(tiny_path: str):
    """Tiny Llama (head_dim 32), float32, a 32-token step budget (forces chunked
    prefill), 32-token KV blocks, and ``max_logprobs=-1`` so tests can ask the engine
    for the dictionary oracle."""
    import genlm_core

    llm = genlm_core.load(
        "vllm",
        model=tiny_path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_batched_tokens=TINY_BUDGET,
        batch_size=16,
        engine_opts={"max_logprobs": -1, "block_size": 32},
    )
    yield llm
    llm.close()


@pytest.fixture(scope="session", autouse=True)
def _release_reference_models():
    yield
    import oracles

    oracles.close_all()
