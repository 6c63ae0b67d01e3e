"""Bursts on vLLM (CPU): genlm-backend's seam (``supports_burst``, ``run_burst(control=...,
max_steps=...)``, draws on the program's event loop) gives the same particles and weights
as the same SMC program through per-step calls (:mod:`genlm_core.testing.burst`)."""

from __future__ import annotations

import asyncio

import pytest

from genlm_core.testing.burst import SMCProgram, run_burst_on_loop, run_steps


def test_burst_seam_matches_steps(tiny_backend) -> None:
    gb = pytest.importorskip("genlm.backend")
    llm = tiny_backend
    assert isinstance(llm, gb.llm.AsyncLM) and llm.supports_burst
    prompt = [1, 45, 496, 173, 701]
    for seed in (0, 1):
        make = lambda seed=seed: SMCProgram(prompt, llm.eos_token_ids, n=8, max_tokens=8, seed=seed)  # noqa: E731
        llm.clear_cache()
        steps = run_steps(llm, make())
        llm.clear_cache()
        burst = asyncio.run(run_burst_on_loop(llm, make()))
        assert burst.tokens == steps.tokens
        assert burst.log_weights == pytest.approx(steps.log_weights, rel=1e-12, abs=1e-12)
        report = burst.extra["report"]
        assert report.aborted >= 8 and report.added > 8 and burst.resamples >= 1
