"""Shared engines for the genlm-vllm tests: vLLM engines are slow to start, so each
model (and the LoRA-enabled tiny engine) gets one in-process engine for the whole
session, closed at its end."""

from __future__ import annotations

import os

import pytest

from genlm_core.testing.plugin import mark_directory

# in-process engine core, small CPU KV cache (the backend sets these too when unset)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here uses the session-wide in-process engines: ``vllm_engine`` runs them
    in a process of their own, apart from the other suites (scripts/test.sh)."""
    mark_directory(items, __file__, pytest.mark.vllm_engine)


#: tokens per engine step of the tiny engine: small, so mixed batches are chunked
TINY_BUDGET = 32


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from genlm_core.testing import models as model_paths

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


@pytest.fixture(scope="session")
def smol_path() -> str:
    from genlm_core.testing import models as model_paths

    return str(model_paths.smollm2())


@pytest.fixture(scope="session")
def smol_backend(smol_path: str):
    """SmolLM2-135M-Instruct (49,152 tokens), float32, in process, TP=1: the reference
    of the SmolLM2 suites; ``max_logprobs=-1`` for the dictionary oracle."""
    import genlm_core

    llm = genlm_core.load(
        "vllm",
        model=smol_path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        engine_opts={"max_logprobs": -1},
    )
    yield llm
    llm.close()


@pytest.fixture(scope="session")
def tiny_lora_adapter(tiny_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random rank-8 LoRA adapter of the tiny Llama (q_proj, v_proj), large effect."""
    from oracles import build_lora_adapter

    return build_lora_adapter(tiny_path, tmp_path_factory.mktemp("lora") / "adapter", scale=20.0)


@pytest.fixture(scope="session")
def tiny_lora_backend(tiny_path: str):
    """The tiny Llama in process with LoRA enabled (rank <= 8): the TP=1 LoRA reference."""
    import genlm_core

    llm = genlm_core.load(
        "vllm",
        model=tiny_path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        enable_lora=True,
        max_lora_rank=8,
    )
    yield llm
    llm.close()


@pytest.fixture(scope="session", autouse=True)
def _release_reference_models():
    yield
    import oracles

    oracles.close_all()
