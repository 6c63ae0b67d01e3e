"""genlm-llamacpp on the tiny Llama's f32 GGUF against independent oracles.

Oracles: a plain transformers float32 forward pass on the same weights (the HF folder
the GGUF was converted from), and the backend's own uncached path (a fresh KV
sequence per context, nothing reused).

Tolerance: llama.cpp and torch compute the same float32 network with other kernels (sum
order, fused RMSNorm/RoPE/softmax); batched vs one-at-a-time vs uncached vs reused KV use
the same weights and f32 KV entries and differ in the order of float32 sums only. Both
are held to the bound derived from that arithmetic (:mod:`genlm_core.testing.tolerance`:
the tiny model's width and depth, float32, each row's magnitude), the same on every CPU;
measured differences are ~1e-6 against transformers and up to 1.4e-5 between paths.
"""

from __future__ import annotations

import random

import pytest
import torch

import genlm_core
from genlm_core.testing.tolerance import assert_tiny_close


def _contexts(rng: random.Random, n: int, lo: int, hi: int, vocab: int = 1024) -> list[list[int]]:
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@pytest.fixture(scope="module")
def llm(tiny_gguf):
    backend = genlm_core.load(
        "llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2, cache_size=0, batch_size=64
    )
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def oracle(tiny_llama_path, oracle_factory):
    return oracle_factory(tiny_llama_path)


def test_vocabulary_equals_decode_vocab_of_the_hf_tokenizer(llm, tiny_llama_path):
    from transformers import AutoTokenizer

    from genlm_core.engine.vocab import decode_vocab

    hf = AutoTokenizer.from_pretrained(str(tiny_llama_path))
    byte_vocab, _ = decode_vocab(hf)
    assert [bytes(t) for t in llm.byte_vocab] == [bytes(t) for t in byte_vocab]
    assert [t.token_id for t in llm.byte_vocab] == list(range(len(byte_vocab)))
    for text in ["Hello world", "  spaces\tand\nnewlines", "café naïve 東京 🦙"]:
        assert llm.tokenizer.encode(text, add_special_tokens=False) == hf.encode(
            text, add_special_tokens=False
        )
    assert llm.eos_token_ids == [hf.eos_token_id]


def test_mixed_batch_agrees_with_transformers(llm, oracle):
    rng = random.Random(1)
    ctxs = _contexts(rng, 12, 1, 40)
    ctxs += [ctxs[0] + [5], ctxs[0] + [6, 7], ctxs[3][:1]]  # shared prefixes, a prefix of another
    out = llm.batch_next_token_logprobs_sync(ctxs)
    assert out.shape == (len(ctxs), len(llm.byte_vocab)) and out.dtype == torch.float32
    for ctx, row in zip(ctxs, out):
        ref = oracle.logprobs(ctx)
        assert_tiny_close(row, ref)


def test_batched_equals_one_at_a_time_equals_uncached(llm):
    rng = random.Random(2)
    ctxs = _contexts(rng, 10, 1, 30)
    llm.clear_cache()
    batched = llm.batch_next_token_logprobs_sync(ctxs)
    llm.clear_cache()
    single = torch.stack([llm.next_token_logprobs_sync(c) for c in ctxs])
    uncached = torch.stack([llm.next_token_logprobs_uncached(c) for c in ctxs])
    assert_tiny_close(batched, single)
    assert_tiny_close(batched, uncached)


@pytest.mark.parametrize("depth", [1, 7, 30, 90])
def test_kv_reuse_at_depth_computes_only_new_tokens(llm, oracle, depth):
    """A cached context of ``depth`` tokens; extensions by 1 and 3 tokens reuse its
    sequence (the counters say how many tokens were computed) and agree with HF and
    with the uncached path."""
    rng = random.Random(depth)
    base = _contexts(rng, 1, depth, depth)[0]
    llm.clear_cache()
    llm.next_token_logprobs_sync(base)
    before = llm.stats()["engine"]
    ext = [base + [11], base + [12], base + [13, 14, 15]]
    rows = llm.batch_next_token_logprobs_sync(ext)
    after = llm.stats()["engine"]
    assert after["tokens_computed"] - before["tokens_computed"] == 1 + 1 + 3
    assert after["tokens_reused"] - before["tokens_reused"] == 3 * depth
    for ctx, row in zip(ext, rows):
        assert_tiny_close(row, llm.next_token_logprobs_uncached(ctx))
        assert_tiny_close(row, oracle.logprobs(ctx))


def test_particles_extend_one_token_at_a_time(llm, oracle):
    """An SIS-like run: 8 particles, each step extends every particle by one token;
    after the prompt, every step computes exactly one token per particle."""
    rng = random.Random(3)
    prompt = _contexts(rng, 1, 20, 20)[0]
    llm.clear_cache()
    llm.next_token_logprobs_sync(prompt)
    particles = [list(prompt) for _ in range(8)]
    for _step in range(5):
        for p in particles:
            p.append(rng.randrange(1, 1024))
        before = llm.stats()["engine"]["tokens_computed"]
        rows = llm.batch_next_token_logprobs_sync(particles)
        assert llm.stats()["engine"]["tokens_computed"] - before == len(particles)
    for p, row in zip(particles, rows):
        assert_tiny_close(row, oracle.logprobs(p))


def test_eviction_keeps_results_right_and_sequences_accounted(tiny_gguf, oracle):
    """Four sequences and a budget of 40 KV cells: contexts evict each other constantly;
    every result still agrees with HF, the cells in use stay within the budget, and every
    llama.cpp sequence is either free or read by cached prefixes (none leaks)."""
    llm = genlm_core.load(
        "llamacpp",
        model=str(tiny_gguf),
        kv_cache_type="f32",
        n_threads=2,
        n_seq_max=4,
        kv_cache_tokens=40,
        cache_size=0,
    )
    try:
        rng = random.Random(4)
        base = _contexts(rng, 3, 10, 18)
        for round_ in range(4):
            ctxs = [b + [rng.randrange(1, 1024) for _ in range(round_)] for b in base]
            rows = llm.batch_next_token_logprobs_sync(ctxs)
            for ctx, row in zip(ctxs, rows):
                assert_tiny_close(row, oracle.logprobs(ctx))
            stats = llm.stats()
            held = len(llm.kv_calls.reuse._readers)  # sequences cached prefixes read
            assert stats["engine"]["free_sequences"] + held == 4
            assert stats["engine"]["kv_cells_used"] <= 40
        assert llm.stats()["prefix_cache"]["kv_evictions"] > 0
        # a reused prefix after evictions is still right
        again = llm.next_token_logprobs_sync(base[0] + [9])
        assert_tiny_close(again, oracle.logprobs(base[0] + [9]))
    finally:
        llm.close()


def test_kv_cells_full_evicts_and_stays_correct(tiny_gguf, oracle):
    """kv_cells=64 (llama.cpp rounds the cells up to 256): batches of 4 contexts of 60
    tokens need 240 cells each, so from the second batch on the cache has no room for
    them: cached sequences are evicted before the batch decodes."""
    llm = genlm_core.load(
        "llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2, kv_cells=64, cache_size=0
    )
    try:
        assert llm.stats()["engine"]["kv_cells"] == 256
        rng = random.Random(5)
        for _ in range(4):
            ctxs = _contexts(rng, 4, 60, 60)
            rows = llm.batch_next_token_logprobs_sync(ctxs)
            for ctx, row in zip(ctxs, rows):
                assert_tiny_close(row, oracle.logprobs(ctx))
        assert llm.stats()["prefix_cache"]["kv_evictions"] > 0
    finally:
        llm.close()


def test_too_long_context_is_a_clear_error_and_backend_stays_healthy(tiny_gguf):
    llm = genlm_core.load("llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2, n_ctx=32)
    try:
        # 32 positions: contexts of N - 1 = 31 tokens (the core's one rule, as for a checkpoint)
        assert llm.max_context_length == 31
        with pytest.raises(ValueError, match="at most 31"):
            llm.next_token_logprobs_sync([1] * 32)
        with pytest.raises(ValueError):
            llm.next_token_logprobs_sync([1, 5000])
        row = llm.next_token_logprobs_sync([1] * 31)
        assert_tiny_close(row, llm.next_token_logprobs_uncached([1] * 31))
    finally:
        llm.close()


def test_bad_model_arguments_are_clear_errors(tmp_path, tiny_gguf):
    with pytest.raises(genlm_core.ConfigError, match="n_seq_max"):
        genlm_core.backend_config("llamacpp", n_seq_max=1)
    with pytest.raises(genlm_core.ConfigError, match="kv_cache_type"):
        genlm_core.backend_config("llamacpp", kv_cache_type="f8")
    with pytest.raises(genlm_core.ConfigError, match="does not exist"):
        genlm_core.load("llamacpp", model=str(tmp_path / "nope.gguf"))
    with pytest.raises(genlm_core.ConfigError, match="holds no .gguf file"):
        genlm_core.load("llamacpp", model=str(tmp_path))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match="not a GGUF file"):  # the core reads its header first
        genlm_core.load("llamacpp", model=str(bad))
    (tmp_path / "other.gguf").write_bytes(b"")
    with pytest.raises(genlm_core.ConfigError, match="gguf_file"):
        genlm_core.load("llamacpp", model=str(tmp_path))


def test_auto_picks_llamacpp_for_gguf_files(tiny_gguf, tiny_llama_path):
    assert genlm_core.resolve("auto", model=str(tiny_gguf)).name == "llamacpp"
    assert genlm_core.resolve("auto", model=str(tiny_llama_path)).name != "llamacpp"
    llm = genlm_core.load(model=tiny_gguf, n_threads=2)
    try:
        assert llm.backend_name == "llamacpp"
    finally:
        llm.close()


@pytest.mark.asyncio
async def test_sampling_seeded_with_eos(llm):
    prompt = [5, 6, 7]
    a = await llm.sample(prompt, max_tokens=8, seed=3)
    assert a == await llm.sample(prompt, max_tokens=8, seed=3)
    many = await llm.batch_sample([prompt, prompt + [1]], max_tokens=4, seed=1)
    assert len(many) == 2


def test_rows_normalised_one_by_one_equal_the_batch_normalised(llm):
    """The engine copies each row of logits out of llama.cpp's output buffer and the core
    normalises each row alone (``Rows.compute``); ``engine.logits`` copies the
    same logits into one batch, which the core normalises as a batch. Same logits, same
    float32 log_softmax: equal within the derived bound (bitwise here). Every row is a
    tensor of its own. (Contexts reach the engine distinct: the batcher and the sync path
    de-duplicate.)"""
    rng = random.Random(6)
    ctxs = list(dict.fromkeys(tuple(c) for c in _contexts(rng, 6, 1, 30)))
    llm.clear_cache()
    with llm.engine_lock:
        ours = llm.rows.compute_or_raise(ctxs)
    llm.clear_cache()
    with llm.engine_lock:
        default = llm.rows.finalize(llm.engine.logits(ctxs))
    assert len(ours) == len(ctxs)
    for a, b in zip(ours, default):
        assert a.shape == (len(llm.byte_vocab),) and a.dtype == torch.float32
        assert_tiny_close(a, b)
        assert a.untyped_storage().nbytes() == a.numel() * 4  # compact: owns exactly its row
    assert len({a.untyped_storage().data_ptr() for a in ours}) == len(ours)


def test_a_context_longer_than_the_kv_budget_is_refused_naming_it(tiny_gguf, oracle):
    """kv_cache_tokens bounds the cells a context computed alone takes: a longer context
    is refused before it reaches llama.cpp (a ValueError naming the option and the value
    it needs), and the engine keeps serving the others."""
    llm = genlm_core.load(
        "llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2, kv_cache_tokens=24, cache_size=0
    )
    try:
        assert llm.max_context_length == 24
        with pytest.raises(ValueError, match=r"kv_cache_tokens=24\).*needs kv_cache_tokens >= 30"):
            llm.next_token_logprobs_sync(list(range(1, 31)))
        ctx = list(range(1, 25))
        assert_tiny_close(llm.next_token_logprobs_sync(ctx), oracle.logprobs(ctx))
    finally:
        llm.close()
