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


def test_burst_rows_keep_their_kv_in_vllm_sessions(tiny_backend) -> None:
    """A burst's rows are vLLM streaming-input sessions: each step runs one token per row
    over the KV the session kept (a resampled particle resumes its parent's session), as the
    step loop's calls do on the resident path; no session outlives the burst. Then every row a burst hands the control is the
    uncached model's, with another caller's calls between steps (which close the sessions),
    a cache reset mid-burst, and a control that fails (:func:`check_decode_rows`)."""
    from genlm_core.testing.burst import SMCProgram, check_decode_rows, run_burst, run_steps

    llm = tiny_backend
    prompt = [1, 45, 496, 173, 701] + list(range(100, 140))  # 45 tokens: one full block and a tail

    def engine() -> dict:
        return dict(llm.stats()["engine"])

    computed, results = [], []
    before = engine()
    for run in (run_steps, run_burst):
        llm.clear_cache()
        start = engine()["tokens_computed"]
        results.append(run(llm, SMCProgram(prompt, llm.eos_token_ids, n=8, max_tokens=9, seed=4)))
        computed.append(engine()["tokens_computed"] - start)
    after = engine()
    report = results[1].extra["report"]
    started = after["decode_sessions_started"] - before["decode_sessions_started"]
    resumed = after["decode_sessions_resumed"] - before["decode_sessions_resumed"]
    shared = after["decode_rows_shared"] - before["decode_rows_shared"]
    assert after["decode_sessions"] == 0
    # every drawn row was one turn of a session, or shared the row of another on its context
    # (the first step's particles, all on the prompt); rows after the first step resumed one
    assert started + resumed + shared == report.rows_drawn and resumed > report.rows_drawn // 2
    assert shared >= 7  # the first step: one of 8 rows runs the prompt
    # a resampled particle took over its parent's session: fewer starts than rows added
    assert started < report.added
    # the step loop's calls continue their rows' sessions too (the resident path): the
    # burst computes no more than they do (before the resident path: fewer)
    assert computed[1] <= computed[0], computed
    check_decode_rows(llm, prompt)
