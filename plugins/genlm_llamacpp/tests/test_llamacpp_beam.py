"""The byte beam (K=5, ``prefill`` over 328 bytes) on llama.cpp: the workload that plans
many contexts per decode reading shared prefixes at several depths (each step's
candidates extend the beam's contexts by a token, some in place, some by copies).

Oracles: genlm-hf float32 on the folder each GGUF was written from (the same weights);
and llama.cpp's own KV state after the run (every sequence the backend holds free is
empty, every cached entry's sequence holds its positions).
"""

from __future__ import annotations

import asyncio
import math

import llama_cpp as L
import pytest

import genlm_core
from genlm_core.bytes import BeamParams, ByteBeamState

TEXT = (
    b"The river flows quietly through the old town, past the mill and the church. "
    b"Children play on its banks in summer, and in winter the ice is thick enough to walk on. "
    b"Every year the town holds a fair by the water, with music, bread from the bakery and "
    b"boats decorated with flowers. Visitors come from the villages around to see it."
)
HF_ATOL = 1e-3  # per logprob, f32 GGUF vs transformers (test_llamacpp_backend's bound)


def beam_logz(llm) -> float:
    async def run() -> float:
        state = await ByteBeamState.initial(llm, BeamParams(K=5))
        state = await state.prefill(TEXT)
        return float(state.logZ)

    return asyncio.run(run())


def assert_kv_consistent(llm) -> None:
    """llama.cpp's memory agrees with the backend's bookkeeping."""
    mem = llm.engine.context.mem
    for seq in llm.engine.free_sequences:
        assert L.llama_memory_seq_pos_max(mem, seq) == -1, f"free sequence {seq} holds positions"
    cache = llm.prefix_cache
    if cache is not None:
        for node in list(cache._kv_lru.values()):
            seq = node.kv
            assert L.llama_memory_seq_pos_max(mem, seq.kv.seq_id) >= seq.n_tokens - 1


def test_beam_on_the_tiny_f32_gguf_equals_transformers(tiny_gguf, tiny_llama_path) -> None:
    assert len(TEXT) >= 300
    hf = genlm_core.load("hf", model=str(tiny_llama_path), dtype="float32")
    try:
        want = beam_logz(hf)
        n_tokens = len(hf.tokenizer.encode(TEXT.decode(), add_special_tokens=False))
    finally:
        hf.close()
    llm = genlm_core.load("llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2)
    try:
        got = beam_logz(llm)
        assert_kv_consistent(llm)
        assert llm.stats()["engine"]["tokens_reused"] > 0  # the planner's path, not recomputation
    finally:
        llm.close()
    # logZ sums at most n_tokens logprobs per path, each within HF_ATOL of transformers'
    # (measured: 2e-5 in all); a wrong KV position moves a logprob by more than 0.1
    assert math.isfinite(got) and abs(got - want) <= n_tokens * HF_ATOL, (got, want, n_tokens)


@pytest.fixture(scope="module")
def smollm2_hf_logz(smollm2_path) -> float:
    hf = genlm_core.load("hf", model=str(smollm2_path), dtype="float32")
    try:
        return beam_logz(hf)
    finally:
        hf.close()


@pytest.mark.slow
@pytest.mark.parametrize("gguf", ["q4_1", "f16"])
def test_beam_on_the_smollm2_ggufs_reads_like_transformers(gguf, smollm2_gguf, smollm2_hf_logz) -> None:
    """Bits per byte of the text under the beam, against transformers float32 on the folder
    both GGUFs come from. Measured (AMD EPYC, AVX2): 1.0376 hf, 1.0335 Q4_1 (q8_1
    activations), 1.0377 f16; the bound 0.01 is 2.4x the Q4_1 gap, while a lost or misplaced
    KV position costs several nats on its token (tenths of a bit per byte here)."""
    from genlm_llamacpp.convert import smollm2_f16_gguf_path

    path = smollm2_gguf if gguf == "q4_1" else smollm2_f16_gguf_path()
    want = smollm2_hf_logz
    llm = genlm_core.load("llamacpp", model=str(path), n_threads=2)
    try:
        got = beam_logz(llm)
        assert_kv_consistent(llm)
    finally:
        llm.close()
    bpb = [-z / len(TEXT) / math.log(2) for z in (got, want)]
    print(f"SmolLM2 {gguf} GGUF beam K=5: {bpb[0]:.4f} bits/byte; transformers f32 {bpb[1]:.4f}")
    assert abs(bpb[0] - bpb[1]) <= 0.01, bpb
