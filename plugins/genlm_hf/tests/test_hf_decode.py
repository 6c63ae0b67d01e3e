"""Bursts: on the KV pool (the default off the static path) a burst's steps are ordinary
calls, checked against the step loop (exact) and the counters; on the static path its
decode batches (genlm_hf.decode) keep their KV between steps, checked by the kit."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import load_hf

from genlm_core.testing.burst import check_decode_batches, check_parity


@pytest.fixture(scope="module")
def small_batches(tiny_llama_path):
    """Batches of 4: ten particles make three batches, which rows ending and resampling
    reshuffle."""
    llm = load_hf(tiny_llama_path, batch_size=4, static_decode="on")  # kept batches: the static path's
    yield llm
    llm.close()


def _prompt(llm, n: int = 7) -> list[int]:
    g = torch.Generator().manual_seed(11)
    return torch.randint(3, llm.vocab_size, (n,), generator=g).tolist()


def _engine(llm) -> dict:
    return dict(llm.stats()["engine"])


def test_a_burst_on_the_pool_matches_steps_exactly_and_runs_new_tokens_only(tiny_llama_path) -> None:
    llm = load_hf(tiny_llama_path, batch_size=4)
    try:
        assert llm.engine.pool is not None and "decode" not in llm.engine.supports
        before = _engine(llm)
        out = check_parity(llm, _prompt(llm), seeds=(0, 1, 2), n=10, max_tokens=9)
        after = _engine(llm)
        assert out == {"exact": 3, "statistical": 0, "same_arithmetic": True}
        # contexts of 8-16 tokens, each resuming its parent's pages: about 10 tokens reused for
        # each computed (reusing only the 7-token prompt would give about 1.4; nothing, 0)
        reused = after["tokens_reused"] - before["tokens_reused"]
        assert reused > 5 * (after["tokens_computed"] - before["tokens_computed"])
    finally:
        llm.close()


def test_the_kit_checks_decode_batches_with_three_batches_a_step(small_batches) -> None:
    check_decode_batches(small_batches, _prompt(small_batches))
