"""Decode batches on mlx (genlm_mlx.decode): a burst's batch caches kept between its
steps, in batches of 4 (ten particles make three, which ending and resampling reshuffle):
exact parity with the step loop, each token run once, every row the uncached model's."""

from __future__ import annotations

import genlm_core
from genlm_core.testing.burst import check_decode_batches, check_parity


def test_decode_batches_in_batches_of_four(tiny_llama_path) -> None:
    llm = genlm_core.load("mlx", model=str(tiny_llama_path), batch_size=4)
    try:
        prompt = [17, 230, 5, 981, 44, 3, 612]
        assert check_parity(llm, prompt, seeds=(0, 1, 2), n=10, max_tokens=9) == {
            "exact": 3,
            "statistical": 0,
            "same_arithmetic": True,
        }
        check_decode_batches(llm, prompt)
        assert llm.stats()["engine"]["decode_batches_resumed"] > 0
    finally:
        llm.close()
