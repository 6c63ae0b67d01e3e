"""Bursts on vLLM (CPU): genlm-backend's seam (``supports_burst``, ``run_burst(control=...,
max_steps=...)``, draws on the program's event loop) gives the same particles and weights
as the same SMC program through per-step calls (:mod:`genlm_core.testing.burst`)."""

from __future__ import annotations

import pytest

from genlm_core.testing.burst import check_seam


def test_burst_seam_matches_steps(tiny_backend) -> None:
    gb = pytest.importorskip("genlm.backend")
    llm = tiny_backend
    assert isinstance(llm, gb.llm.AsyncLM) and llm.supports_burst
    check_seam(llm, [1, 45, 496, 173, 701])
