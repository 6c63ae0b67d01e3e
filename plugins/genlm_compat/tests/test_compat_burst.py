"""genlm-backend's burst seam (branch shepard/speedups: ``llm.supports_burst``,
``llm.run_burst(control=..., max_steps=...)`` driven by an ``EngineControl``) over
genlm-core's engines, through genlm-compat's objects, as genlm-control's burst loop
uses it: ``run_burst`` in an executor thread, each draw a coroutine on the program's
event loop. The control (:mod:`genlm_core.testing.burst`) follows the documented
protocol: initial adds, draws, an abort per ended particle, at each resampling point
the abort of every live row and the re-add of the resampled prefixes with fresh
handles, ``on_burst_end``. Its oracle is the same program through per-step calls."""

from __future__ import annotations

import pytest

import genlm_core
from genlm_core.testing.burst import check_seam

gb = pytest.importorskip("genlm.backend")


def _same_program_both_ways(llm, prompt: list[int]) -> None:
    assert isinstance(llm, gb.llm.AsyncLM) and llm.supports_burst
    check_seam(llm, prompt, seeds=(0, 1, 2))


def test_burst_seam_on_hf() -> None:
    from genlm_core.testing import models

    llm = gb.load_model_by_name(
        str(models.tiny_llama()), backend="hf", llm_opts={"hf_opts": {"torch_dtype": "float"}}
    )
    try:
        _same_program_both_ways(llm, [1, 45, 496, 173, 701])
    finally:
        llm.close()


@pytest.mark.native_engine
def test_burst_seam_on_llamacpp() -> None:
    from genlm_llamacpp.convert import tiny_gguf_path

    llm = genlm_core.load("llamacpp", model=str(tiny_gguf_path("llama", "f32")), kv_cache_type="f32")
    try:
        _same_program_both_ways(llm, [1, 45, 496, 173, 701])
    finally:
        llm.close()
