"""KV prefix reuse: batched == unbatched == uncached, at every cached depth, under eviction."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from hf_helpers import load_hf, max_diff, reference

from genlm_core.testing.tolerance import assert_tiny_close


def _contexts(V: int, seed: int = 0) -> list[list[int]]:
    """Mixed lengths; some share prefixes (of several depths), some share nothing."""
    rng = random.Random(seed)
    tok = lambda: rng.randrange(3, V)  # noqa: E731
    base = [tok() for _ in range(14)]
    other = [tok() for _ in range(9)]
    return [
        base[:1],
        base[:4],
        base[:9],
        base,
        base[:4] + [tok(), tok()],
        other,
        other[:3] + [tok()],
        [tok() for _ in range(6)],
        [tok()],
    ]


def _engine(llm) -> dict:
    return dict(llm.stats()["engine"])


def test_batched_equals_unbatched_equals_uncached(tiny) -> None:
    llm = tiny
    llm.clear_cache()
    ctxs = _contexts(llm.vocab_size)
    ref = reference(llm, ctxs)
    # KV cached at various depths before the batch: 0 (none), 2, 4 (= a whole context), 11
    for depth in (2, 4, 11):
        llm.cache_kv(ctxs[3][:depth])
    assert sorted(map(len, llm.prefix_cache.kv_prefixes())) == [2, 4, 11]
    llm.output_cache.clear()
    batched = llm.batch_next_token_logprobs_sync(ctxs)  # one batch: rows with/without pasts
    assert_tiny_close(batched, ref)
    # unbatched, each from clean caches
    for c, r in zip(ctxs, ref):
        llm.clear_cache()
        assert_tiny_close(llm.next_token_logprobs_sync(c), r)
    # now every context has KV: extend each by one or three tokens, in one batch
    llm.clear_cache()
    llm.batch_next_token_logprobs_sync(ctxs)
    rng = random.Random(1)
    ext = [c + [rng.randrange(3, llm.vocab_size) for _ in range(1 + 2 * (i % 2))] for i, c in enumerate(ctxs)]
    before = _engine(llm)
    got = llm.batch_next_token_logprobs_sync(ext)
    after = _engine(llm)
    assert after["tokens_computed"] - before["tokens_computed"] == sum(
        len(e) - len(c) for e, c in zip(ext, ctxs)
    )
    assert_tiny_close(got, reference(llm, ext))


def test_extension_by_one_token_runs_one_token(tiny) -> None:
    llm = tiny
    llm.clear_cache()
    ctx = _contexts(llm.vocab_size, seed=3)[3]
    llm.next_token_logprobs_sync(ctx)
    before = _engine(llm)
    lp = llm.next_token_logprobs_sync(ctx + [7])  # the sync path uses the ancestor's KV
    after = _engine(llm)
    assert after["tokens_computed"] - before["tokens_computed"] == 1
    assert after["tokens_reused"] - before["tokens_reused"] == len(ctx)
    assert_tiny_close(lp, llm.next_token_logprobs_uncached(ctx + [7]))


async def test_async_particles_reuse_kv_and_match(tiny) -> None:
    llm = tiny
    llm.clear_cache()
    rng = random.Random(5)
    prompt = [rng.randrange(3, llm.vocab_size) for _ in range(5)]
    particles = [list(prompt) for _ in range(6)]
    computed = reused = 0
    for _ in range(4):
        before = _engine(llm)
        rows = await asyncio.gather(*(llm.next_token_logprobs(p) for p in particles))
        after = _engine(llm)
        computed += after["tokens_computed"] - before["tokens_computed"]
        reused += after["tokens_reused"] - before["tokens_reused"]
        for p, row in zip(particles, rows):
            assert_tiny_close(row, llm.next_token_logprobs_uncached(p))
            p.append(rng.randrange(3, llm.vocab_size))
    assert computed == 5 + 3 * 6  # the prompt once (merged), then one token per particle
    assert reused == 6 * (5 + 6 + 7)  # each later step reuses the particle's whole previous context


def test_suffix_merge_fault_is_fixed(tiny) -> None:
    """Two contexts with equal suffixes after different cached prefixes, in one batch."""
    llm = tiny
    llm.clear_cache()
    V = llm.vocab_size
    pa, pb = [11, 12, 13, 14], [21, 22, 23, 24]  # same length: same past length too
    suffix = [31, 32]
    llm.cache_kv(pa)
    llm.cache_kv(pb)
    llm.output_cache.clear()
    a, b = pa + suffix, pb + suffix
    assert max(a + b) < V
    before = _engine(llm)
    got = llm.batch_next_token_logprobs_sync([a, b])
    assert _engine(llm)["forward_calls"] - before["forward_calls"] == 1  # one batch
    ra, rb = reference(llm, [a, b])
    assert_tiny_close(got[0], ra)
    assert_tiny_close(got[1], rb)
    assert max_diff(ra, rb) > 1e-3  # the two really differ


async def test_suffix_merge_fault_async(tiny) -> None:
    llm = tiny
    llm.clear_cache()
    pa, pb, suffix = [41, 42, 43], [51, 52, 53], [61]
    llm.cache_kv(pa)
    llm.cache_kv(pb)
    ga, gb = await asyncio.gather(llm.next_token_logprobs(pa + suffix), llm.next_token_logprobs(pb + suffix))
    assert_tiny_close(ga, llm.next_token_logprobs_uncached(pa + suffix))
    assert_tiny_close(gb, llm.next_token_logprobs_uncached(pb + suffix))
    assert max_diff(ga, gb) > 1e-3


def test_eviction_mid_run_stays_correct(tiny_gpt2_path: str) -> None:
    # one KV entry of this model holds 2 layers x 2 x 2 heads x 32 x 4 bytes = 1 KiB per token
    llm = load_hf(tiny_gpt2_path, kv_cache_bytes=24 * 1024, cache_size=0, batch_size=4)
    try:
        rng = random.Random(7)
        V = llm.vocab_size
        particles = [[rng.randrange(3, V) for _ in range(rng.randint(1, 6))] for _ in range(6)]
        for step in range(6):
            got = llm.batch_next_token_logprobs_sync(particles)
            assert_tiny_close(got, reference(llm, particles), str(step))
            assert llm.prefix_cache.kv_bytes <= 24 * 1024
            for p in particles:
                p.append(rng.randrange(3, V))
        stats = llm.prefix_cache.stats()
        assert stats["kv_evictions"] > 0
        assert _engine(llm)["tokens_reused"] > 0
    finally:
        llm.close()


def test_cache_kv_and_clear_kv_cache(llama) -> None:
    llm = llama
    llm.clear_cache()
    prompt = [5, 6, 7, 8, 9]
    llm.cache_kv(prompt)
    assert llm.prefix_cache.kv_prefixes() == [tuple(prompt)]
    before = _engine(llm)
    llm.cache_kv(prompt)  # already there: no work
    assert _engine(llm)["forward_calls"] == before["forward_calls"]
    lp = llm.next_token_logprobs_sync(prompt + [10])
    assert _engine(llm)["tokens_computed"] - before["tokens_computed"] == 1
    llm.clear_kv_cache()
    assert llm.prefix_cache.kv_prefixes() == []
    assert llm.prefix_cache.kv_bytes == 0
    llm.cache_kv(prompt)  # logprobs are cached but the KV is gone: recomputed
    assert llm.prefix_cache.kv_prefixes() == [tuple(prompt)]
    llm.output_cache.clear()
    assert_tiny_close(llm.next_token_logprobs_sync(prompt + [10]), lp)
    with pytest.raises(ValueError):
        llm.cache_kv([])


def test_kv_payloads_own_exactly_their_bytes(llama) -> None:
    llm = llama
    llm.clear_cache()
    llm.batch_next_token_logprobs_sync([[1, 2, 3], [4, 5], [6, 7, 8, 9]])
    total = 0
    for prefix in llm.prefix_cache.kv_prefixes():
        depth, kv = llm.prefix_cache.deepest_kv(prefix)
        assert depth == len(prefix)
        cfg = llm.model.config
        assert kv.shape == (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, depth, cfg.head_dim)
        assert kv.is_contiguous()
        assert kv.untyped_storage().nbytes() == kv.numel() * kv.element_size()
        total += kv.numel() * kv.element_size()
    assert total == llm.prefix_cache.kv_bytes


def test_a_stored_kv_is_never_the_reused_batch_buffer(llama) -> None:
    """The batch KV buffer's memory is reused from pass to pass: a row's stored KV must
    be a copy, also where its slice of the buffer is the whole buffer (one row, no
    padding), else the next pass would overwrite it. Oracle: the KV as first stored."""
    llm = llama
    llm.clear_cache()
    llm.next_token_logprobs_sync([11, 12, 13])  # one row: its slice is the whole buffer
    depth, first = llm.prefix_cache.deepest_kv((11, 12, 13))
    assert depth == 3
    kept = first.clone()
    block = llm.engine.workspace._block
    assert block is not None  # the buffer's memory was kept for the next pass
    start = block.untyped_storage().data_ptr()
    assert not start <= first.data_ptr() < start + block.untyped_storage().nbytes()
    llm.next_token_logprobs_sync([21, 22, 23])  # same shape: the same memory again
    assert llm.engine.workspace._block is block
    assert torch.equal(llm.prefix_cache.deepest_kv((11, 12, 13))[1], kept)
    row = llm.next_token_logprobs_sync([11, 12, 13, 14])  # resumes from the kept KV
    assert_tiny_close(row, reference(llm, [[11, 12, 13, 14]])[0])


def test_padded_batch_of_lengths_without_reuse(tiny_llama_path: str) -> None:
    llm = load_hf(tiny_llama_path, prefix_cache=False, cache_size=0)
    try:
        ctxs = _contexts(llm.vocab_size, seed=9)
        got = llm.batch_next_token_logprobs_sync(ctxs)
        assert_tiny_close(got, reference(llm, ctxs))
        assert llm.prefix_cache is None and not llm.kv_reuse  # reuse off: no KV kept
        assert torch.isfinite(got).all()
    finally:
        llm.close()


@pytest.mark.parametrize("forward_thread", [None, True, False])
async def test_forward_thread_choice_gives_the_same_results(tiny_llama_path: str, forward_thread) -> None:
    """On CPU the async batches run on the event loop unless a worker thread is asked for."""
    llm = load_hf(tiny_llama_path, forward_thread=forward_thread)
    try:
        assert llm.batcher.run_in_thread is bool(forward_thread)  # None: CPU model -> the loop
        rng = random.Random(11)
        particles = [[rng.randrange(3, llm.vocab_size) for _ in range(rng.randint(1, 5))] for _ in range(5)]
        for _ in range(3):
            rows = await asyncio.gather(*(llm.next_token_logprobs(p) for p in particles))
            for p, row in zip(particles, rows):
                assert_tiny_close(row, llm.next_token_logprobs_uncached(p))
                p.append(rng.randrange(3, llm.vocab_size))
        assert llm.batcher.stats.batches == 3  # one batch per step either way
    finally:
        llm.close()


def test_kv_slots_refuse_a_layer_of_another_shape() -> None:
    """A model whose layers cache KV of different shapes gets a clear error, not a corrupt batch."""
    from genlm_hf.kv import Row, Slots, _SlotLayer

    slots = Slots([Row((1, 2))], past_len=0, new_len=2)
    first, second = _SlotLayer(slots, 0, 2), _SlotLayer(slots, 1, 2)
    k = torch.randn(1, 2, 2, 8)
    keys, values = first.update(k, k + 1)
    assert torch.equal(keys, k) and torch.equal(values, k + 1) and first.get_seq_length() == 2
    with pytest.raises(RuntimeError, match="prefix_cache=False"):
        second.update(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8))


def _logprob_rows_held(llm) -> list[torch.Tensor]:
    """Every next-token row the backend's caches keep (the output cache, and any row a
    prefix-cache node keeps next to its KV)."""
    held = [] if llm.output_cache is None else [llm.output_cache._data[k][0] for k in llm.output_cache.keys()]
    stack = [llm.prefix_cache.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        row = getattr(node, "logprobs", None)
        if row is not None:
            held.append(row)
    return held


@pytest.mark.parametrize("cache_size", [4096, 0])
async def test_cache_bytes_is_one_logprob_budget(tiny_llama_path: str, cache_size: int) -> None:
    """Rows are kept once, in the output cache (not again in the prefix cache, which would
    hold up to 2x ``cache_bytes``). Real storage is read from the tensors."""
    probe = load_hf(tiny_llama_path)
    row_bytes = probe.vocab_size * 4
    probe.close()
    budget = 6 * row_bytes
    llm = load_hf(tiny_llama_path, cache_bytes=budget, cache_size=cache_size, batch_size=8, timeout=0.01)
    try:
        rng = random.Random(3)
        particles = [[rng.randrange(3, llm.vocab_size)] for _ in range(5)]
        for _ in range(6):  # SIS-like: every particle extends its context by one token
            await asyncio.gather(*(llm.next_token_logprobs(p) for p in particles))
            for p in particles:
                p.append(rng.randrange(3, llm.vocab_size))
            held = _logprob_rows_held(llm)
            real = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}.values())
            assert real <= (budget if cache_size else 0)
    finally:
        llm.close()
