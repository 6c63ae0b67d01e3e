"""Decode batches (genlm_hf.decode): a burst's KV kept between its steps, checked against
the step loop (exact), the uncached model (every row a burst drew from) and the counters."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import load_hf

from genlm_core.testing.burst import check_decode_batches, check_parity


@pytest.fixture(scope="module")
def small_batches(tiny_llama_path):
    """Batches of 4: ten particles make three batches, which rows ending and resampling
    reshuffle."""
    llm = load_hf(tiny_llama_path, batch_size=4)
    yield llm
    llm.close()


def _prompt(llm, n: int = 7) -> list[int]:
    g = torch.Generator().manual_seed(11)
    return torch.randint(3, llm.vocab_size, (n,), generator=g).tolist()


def _engine(llm) -> dict:
    return dict(llm.stats()["engine"])


def test_burst_resumes_kept_batches_and_matches_steps_exactly(small_batches) -> None:
    llm = small_batches
    before = _engine(llm)
    out = check_parity(llm, _prompt(llm), seeds=(0, 1, 2), n=10, max_tokens=9)
    after = _engine(llm)
    assert out == {"exact": 3, "statistical": 0, "same_arithmetic": True}
    assert after["decode_batches_resumed"] > before["decode_batches_resumed"]
    assert after["decode_batches"] == 0  # flushed when each burst ended


def test_the_kit_checks_decode_batches_with_three_batches_a_step(small_batches) -> None:
    check_decode_batches(small_batches, _prompt(small_batches))
