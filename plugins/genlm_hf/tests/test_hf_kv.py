"""KV prefix reuse: batched == unbatched == uncached, at every cached depth, under eviction."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from hf_helpers import column_bytes, load_hf, max_diff, reference

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
    # a column of this model is 2 layers x 2 x 2 heads x 32 x 4 bytes = 1 KiB: a page of 16
    # tokens 16 KiB; the pool holds 6 pages (one reserved), fewer than the particles need
    bound = 6 * 16 * 1024
    llm = load_hf(tiny_gpt2_path, kv_cache_bytes=bound, cache_size=0, batch_size=4)
    try:
        rng = random.Random(7)
        V = llm.vocab_size
        particles = [[rng.randrange(3, V) for _ in range(rng.randint(1, 6))] for _ in range(6)]
        for step in range(12):
            got = llm.batch_next_token_logprobs_sync(particles)
            assert_tiny_close(got, reference(llm, particles), str(step))
            assert llm.engine.pool.nbytes <= bound  # the pool never passed its bound
            for p in particles:
                p.append(rng.randrange(3, V))
        stats = llm.prefix_cache.stats()
        assert stats["kv_evictions"] > 0
        assert _engine(llm)["tokens_reused"] > 0
    finally:
        llm.close()


@pytest.mark.parametrize(
    "policy, prompt_len",
    [("engine", 64), ("engine", 60), ("lru", 64), ("leaves_first", 60)],
)
def test_a_full_pool_releases_particles_not_their_prompt(
    tiny_llama_path: str, policy: str, prompt_len: int, monkeypatch
) -> None:
    """Particles of one prompt, a pool with room for the prompt and about half the
    particles' own pages: each step some particles' contexts are released and computed
    again, from the prompt (every context after the first call resumes at least the
    prompt's tokens: the cost of a release is the particle's own tokens, in proportion
    to what does not fit). Two other policies lose the prompt, and contexts run from their
    first token: releasing the least recently used context whatever it is (``lru``: the
    prompt's own entry while a pass reads it, particles' older ones), and releasing leaves
    first but then, with every leaf a pass reads, the least recently used context others
    extend (``leaves_first``: the prompt, when its last page is partial - 60 tokens - so
    that the pass's rows do not hold all of its pages)."""
    import dataclasses

    from genlm_hf.engine import HFEngine

    from genlm_core.engine.prefix_cache import PrefixCache

    if policy != "engine":  # the core releasing by the cache's order alone (no lineage ranks)
        real = PrefixCache.evict_lru_kv
        first = policy == "leaves_first"
        monkeypatch.setattr(
            PrefixCache,
            "evict_lru_kv",
            lambda self, keep=None, leaves_first=False, leaves_only=False: real(
                self, keep if first else None, leaves_first=first
            ),
        )
        declared = HFEngine.kv_policy
        monkeypatch.setattr(
            HFEngine, "kv_policy", lambda self: dataclasses.replace(declared(self), release="lru")
        )
    # 64 + 8 x 20 columns need 4 + 8 x 2 pages (60: 4 + 8 x 2, each particle copying the
    # prompt's partial page); the pool has 13 (one reserved)
    per_page = 16 * column_bytes(tiny_llama_path)
    llm = load_hf(tiny_llama_path, kv_cache_bytes=13 * per_page, cache_size=0)
    try:
        depths: list[int] = []
        lookup = llm.kv_calls.reuse.lookup

        def record(contexts):
            found = lookup(contexts)
            depths.extend(d for d, _ in found)
            return found

        llm.kv_calls.reuse.lookup = record
        rng = random.Random(4)
        prompt = [rng.randrange(3, llm.vocab_size) for _ in range(prompt_len)]
        parts = [prompt + [rng.randrange(3, llm.vocab_size)] for _ in range(8)]
        llm.next_token_logprobs_sync(prompt)
        depths.clear()
        for step in range(20):
            rng.shuffle(parts)  # a batcher's order varies: the prompt's partial page's writer may come last
            got = llm.batch_next_token_logprobs_sync(parts)
            if step % 5 == 0:
                assert_tiny_close(got, reference(llm, parts), f"step {step}")
            parts = [p + [rng.randrange(3, llm.vocab_size)] for p in parts]
        assert llm.stats()["prefix_cache"]["kv_evictions"] > 0
        if policy == "engine":
            assert min(depths) >= prompt_len  # the prompt always resumed
        else:
            assert min(depths) < prompt_len  # the failure the policy prevents
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


def _pool_kv(llm, seq) -> torch.Tensor:
    """A kept context's columns as ``[layers, 2, kv_heads, length, head_dim]``."""
    return llm.engine.pool.storage[:, :, :, seq.slots(), :]


def _model_kv(llm, ctx) -> torch.Tensor:
    """The model's own KV of ``ctx`` (an uncached pass with transformers' cache)."""
    from genlm_hf.cache_names import output_cache

    model = llm.engine.model
    with torch.inference_mode():
        cache = output_cache(model(torch.tensor([list(ctx)]), use_cache=True))
    return torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers])


def test_kept_contexts_hold_the_models_kv_and_share_pages(llama) -> None:
    """Every kept context's columns are the model's own KV of that context (oracle: an
    uncached pass with transformers' cache), and a context and its extensions share
    their pages: the pool holds the common prefix once."""
    llm = llama
    llm.clear_cache()
    base = list(range(3, 43))  # 40 tokens: two full pages and 8 columns
    ctxs = [base, base + [50], base + [51], base + [51, 52], [6, 7, 8, 9]]
    for c in ctxs:
        llm.next_token_logprobs_sync(c)
    pool = llm.engine.pool
    seqs = {}
    for prefix in llm.prefix_cache.kv_prefixes():
        depth, seq = llm.prefix_cache.deepest_kv(prefix)
        assert depth == len(prefix) == seq.length
        got, want = _pool_kv(llm, seq), _model_kv(llm, prefix)
        assert got.shape == want.shape
        assert_tiny_close(got, want, f"KV of {len(prefix)} tokens")  # float32 rounding only
        seqs[prefix] = seq
    full = [seqs[tuple(c)].pages[:2] for c in ctxs[:4]]
    assert all(p == full[0] for p in full)  # the 32 columns of two full pages: held once
    # base's 40 columns + one page per fork that wrote its own third page, + the short one
    assert pool.pages_in_use <= 2 + 3 + 1


def test_a_kept_context_is_never_overwritten(llama) -> None:
    """Contexts that extend a kept one (forks, in one batch and in later calls) write their
    own columns: the kept context's columns stay as first written (oracle: a copy taken
    then), and each extension's row is the uncached model's."""
    llm = llama
    llm.clear_cache()
    llm.next_token_logprobs_sync([11, 12, 13])
    _, seq = llm.prefix_cache.deepest_kv((11, 12, 13))
    kept = _pool_kv(llm, seq).clone()
    forks = [[11, 12, 13, 14], [11, 12, 13, 15], [11, 12, 13, 15, 16], [21, 22, 23]]
    rows = llm.batch_next_token_logprobs_sync(forks)
    rows2 = llm.batch_next_token_logprobs_sync([f + [17] for f in forks])
    assert torch.equal(_pool_kv(llm, llm.prefix_cache.deepest_kv((11, 12, 13))[1]), kept)
    assert_tiny_close(rows, reference(llm, forks))
    assert_tiny_close(rows2, reference(llm, [f + [17] for f in forks]))


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


def test_a_pass_that_skips_the_pools_attention_is_refused(llama) -> None:
    """A model whose attention does not go through transformers' attention interface
    would compute rows that ignore the pool: a pass counts the layers that attended
    through it and raises (here: a pass told the model has one layer more)."""
    from genlm_hf.attention import PoolPass, use_pool_attention

    engine = llama.engine
    run = PoolPass(
        engine.pool,
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, 1, 0, 0),
        [],
    )
    with pytest.raises(RuntimeError, match="prefix_cache=False"):
        with use_pool_attention(engine.model, run, engine.pool.layout.layers + 1):
            pass
    assert engine.model.config._attn_implementation != "genlm_pool"  # switched back


def test_a_model_the_pool_cannot_hold_runs_whole(tiny_llama_path: str, tmp_path) -> None:
    """A sliding-window model's cache is not plain full-attention KV: no pool, no reuse
    (said once), every context run whole in padded batches of the model's own forward,
    rows equal to the uncached model's."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_path)
    config = AutoConfig.for_model(
        "mistral", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=4, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    with pytest.warns(UserWarning, match="cannot reuse KV"):
        llm = load_hf(str(tmp_path), cache_size=0, kv_pool="auto")
    try:
        assert llm.engine.pool is None and "sliding window" in llm.stats()["engine"]["kv_pool_off"]
        ctxs = _contexts(llm.vocab_size, seed=2)
        assert_tiny_close(llm.batch_next_token_logprobs_sync(ctxs), reference(llm, ctxs))
    finally:
        llm.close()


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
