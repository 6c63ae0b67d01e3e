"""Bursts: a burst's steps are ordinary calls over the KV pool (the core's decode step),
checked against the step loop (exact) and the counters."""

from __future__ import annotations

import torch
from hf_helpers import load_hf

from genlm_core.testing.burst import SMCProgram, check_parity, run_burst


def _prompt(llm, n: int = 7) -> list[int]:
    g = torch.Generator().manual_seed(11)
    return torch.randint(3, llm.vocab_size, (n,), generator=g).tolist()


def _engine(llm) -> dict:
    return dict(llm.stats()["engine"])


def test_a_burst_on_the_pool_matches_steps_exactly_and_runs_new_tokens_only(tiny_llama_path) -> None:
    llm = load_hf(tiny_llama_path, batch_size=4)
    try:
        assert llm.engine.pool is not None and "decode" not in llm.engine.supports
        out = check_parity(llm, _prompt(llm), seeds=(0, 1, 2), n=10, max_tokens=9)
        assert out == {"exact": 3, "statistical": 0, "same_arithmetic": True}
        # the burst alone (check_parity's uncached reference rows compute every token, and
        # count): contexts of 8-16 tokens, each resuming its parent's pages, about 10 tokens
        # reused for each computed (reusing only the 7-token prompt would give about 1.4)
        llm.clear_cache()
        before = _engine(llm)
        run_burst(llm, SMCProgram(_prompt(llm), llm.eos_token_ids, n=10, max_tokens=9, seed=0))
        after = _engine(llm)
        reused = after["tokens_reused"] - before["tokens_reused"]
        assert reused > 5 * (after["tokens_computed"] - before["tokens_computed"])
    finally:
        llm.close()
