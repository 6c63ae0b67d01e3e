"""The byte beam on a real model: SmolLM2-135M through genlm-hf, genlm-vllm, genlm-mlx.

Not skipped when an engine is missing: the test suite runs against every engine.
"""

from __future__ import annotations

import math

import pytest
from model_paths import smollm2

import genlm_core
from genlm_core.bytes import BeamParams, ByteBeamState
from genlm_core.testing.tolerance import model_shape, row_atol, row_magnitude

pytestmark = [pytest.mark.slow, pytest.mark.vllm_engine]  # shares the session's vLLM engines

TEXT = b"An apple a day keeps the doctor away."
PROMPT = b"An apple a day keeps the"
ENGINE_OPTS = {
    "hf": {},
    "vllm": {"dtype": "float32", "max_model_len": 512, "enforce_eager": True},
    "mlx": {},
}
_REF: dict[str, float] = {}


@pytest.fixture(scope="module")
def hf():
    llm = genlm_core.load("hf", model=str(smollm2()))
    yield llm
    llm.close()


async def test_distribution_sums_to_one_at_every_step(hf):
    beam = await ByteBeamState.initial(hf, BeamParams(K=5))
    bm = await beam.prefill(b"An apple")
    for c in b" a day, ":
        q = await bm.prune().logp_next()
        assert q.total() == pytest.approx(1.0, abs=1e-6)
        assert math.exp(q[c]) > 1e-4  # the text is plausible to the model
        bm = await (bm.prune() << c)
    assert -60 < bm.logZ < 0


async def test_greedy_continuation_is_printable_text(hf):
    beam = await ByteBeamState.initial(hf, BeamParams(K=5))
    out = await beam.greedy(PROMPT, 24)
    assert out.startswith(PROMPT)
    cont = out[len(PROMPT) :].decode("utf-8")
    assert len(cont) >= 3
    assert all(ch.isprintable() or ch in "\n\t" for ch in cont), cont
    assert sum(ch.isalpha() for ch in cont) >= 3, cont


async def _logz(llm) -> float:
    beam = await ByteBeamState.initial(llm, BeamParams(K=3, eos_tokens=()))
    return await beam.log_prefix_prob(TEXT)


@pytest.mark.parametrize("engine", ["vllm", "mlx"])
async def test_same_logZ_across_engines(hf, engine):
    if "hf" not in _REF:
        _REF["hf"] = await _logz(hf)
    llm = genlm_core.load(engine, model=str(smollm2()), **ENGINE_OPTS[engine])
    try:
        got = await _logz(llm)
    finally:
        llm.close()
    ref = _REF["hf"]
    assert -80 < ref < 0
    # the beam's logZ sums one logprob per token of TEXT at most, each the same float32
    # network through other kernels: that many row bounds (genlm_core.testing.tolerance)
    ids = hf.tokenizer.encode(TEXT.decode("utf-8", "replace"), add_special_tokens=False)
    bound = len(ids) * row_atol(model_shape(smollm2()), row_magnitude(hf.next_token_logprobs_sync(ids)))
    assert got == pytest.approx(ref, abs=bound), (engine, got, ref, bound)
