"""MLXBackend on the tiny offline models: exactness against transformers, KV reuse,
eviction, sampling, bad inputs, and models whose caches cannot be reused."""

from __future__ import annotations

import asyncio
import warnings

import pytest
import torch

import genlm_core
from genlm_core.testing.tolerance import assert_rows_close, assert_tiny_close, tiny_shape

# mlx against torch, and mlx's batched / cached paths against its uncached one: the same
# float32 network through other kernels or batch shapes, held to the bound derived from
# the arithmetic (genlm_core.testing.tolerance); measured ~1e-6 against torch.


def _contexts(seed: int, n: int, lo: int, hi: int, vocab: int = 1000) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=g))
        out.append(torch.randint(1, vocab, (length,), generator=g).tolist())
    return out


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def arch_path(request, tiny_llama_path, tiny_gpt2_path):
    return {"llama": tiny_llama_path, "gpt2": tiny_gpt2_path}[request.param]


@pytest.fixture(scope="module")
def llm(arch_path):
    backend = genlm_core.load("mlx", model=str(arch_path), prefill_step_size=4)
    yield backend
    backend.close()


def test_matches_transformers(llm, arch_path, oracle_factory):
    oracle = oracle_factory(arch_path)
    ctxs = _contexts(0, 5, 1, 30)
    batch = llm.batch_next_token_logprobs_sync(ctxs)
    for ctx, row in zip(ctxs, batch):
        ref = oracle.logprobs(ctx)
        assert row.shape == ref.shape and row.dtype == torch.float32
        assert_tiny_close(row, ref, str((row - ref).abs().max()))


def test_long_context_prefill_steps_match_transformers(llm, arch_path, oracle_factory):
    # 200 tokens prefilled 4 at a time, batched with a short context (left padding).
    ctxs = _contexts(1, 2, 190, 200) + [[3, 4]]
    batch = llm.batch_next_token_logprobs_sync(ctxs)
    oracle = oracle_factory(arch_path)
    for ctx, row in zip(ctxs, batch):
        assert_tiny_close(row, oracle.logprobs(ctx))


@pytest.mark.asyncio
async def test_concurrent_requests_are_batched(llm):
    llm.clear_cache()
    ctxs = _contexts(2, 12, 1, 10)
    before = llm.batcher.stats.batches
    rows = await asyncio.gather(*(llm.next_token_logprobs(c) for c in ctxs))
    assert llm.batcher.stats.batches - before < len(ctxs)
    for ctx, row in zip(ctxs, rows):
        assert_tiny_close(row, llm.next_token_logprobs_uncached(ctx))


class CountingModel:
    """Delegates to an mlx-lm model and records the token width of every call."""

    def __init__(self, model):
        self._model = model
        self.widths: list[int] = []

    def __call__(self, tokens, cache=None):
        self.widths.append(int(tokens.shape[1]))
        return self._model(tokens, cache=cache)

    def __getattr__(self, name):
        return getattr(self._model, name)


def test_cache_kv_prefix_is_reused(llm):
    from genlm_mlx.engine import MLXEngine

    from genlm_core.engine import BaseLogprobBackend

    counting = CountingModel(llm.mlx_model)
    backend = BaseLogprobBackend(MLXEngine(counting, llm.mlx_tokenizer, llm.config), llm.config)
    try:
        prompt = _contexts(3, 1, 20, 20)[0]
        backend.cache_kv(prompt)
        assert backend.prefix_cache.kv_prefixes() == [tuple(prompt)]
        counting.widths.clear()
        ext = prompt + [7, 9]
        row = backend.next_token_logprobs_sync(ext)
        assert sum(counting.widths) == 2  # only the two new tokens were computed
        engine = backend.stats()["engine"]
        assert engine["tokens_reused"] == 20 and engine["kv_reuse"] is True
        assert_tiny_close(row, backend.next_token_logprobs_uncached(ext))
        # a batch of particles each extending a cached context by one token
        counting.widths.clear()
        rows = backend.batch_next_token_logprobs_sync([ext + [t] for t in (1, 2, 3)])
        assert counting.widths == [1]
        for t, r in zip((1, 2, 3), rows):
            assert_tiny_close(r, backend.next_token_logprobs_uncached(ext + [t]))
    finally:
        backend.close()


def test_cached_equals_uncached_after_eviction(tiny_llama_path, caplog):
    # budget of ~3 payloads of 8 tokens: constant LRU eviction along growing contexts
    per_token = 2 * 2 * 1 * 32 * 4  # layers * (k, v) * kv_heads * head_dim * float32
    llm = genlm_core.load(
        "mlx", model=str(tiny_llama_path), kv_cache_bytes=3 * 8 * per_token, cache_size=0, batch_size=4
    )
    try:
        base = _contexts(4, 4, 4, 6)
        for step in range(6):
            ctxs = [b + [10 + step + i for i in range(step)] for b in base]
            got = llm.batch_next_token_logprobs_sync(ctxs)
            for ctx, row in zip(ctxs, got):
                assert_tiny_close(row, llm.next_token_logprobs_uncached(ctx))
            stats = llm.prefix_cache.stats()
            assert stats["kv_bytes"] <= llm.config.kv_cache_bytes
        assert llm.prefix_cache.stats()["kv_evictions"] > 0
        assert llm.prefix_cache.stats()["kv_entries"] >= 1
        # a context whose KV exceeds the whole budget is computed but never stored, and
        # one warning names the budget's option, the bytes that context needs and the fix
        long = _contexts(6, 1, 30, 30)[0]
        with caplog.at_level("WARNING", logger="genlm"):
            row = llm.next_token_logprobs_sync(long)
        assert_tiny_close(row, llm.next_token_logprobs_uncached(long))
        assert tuple(long) not in llm.prefix_cache.kv_prefixes()
        (note,) = [r.getMessage() for r in caplog.records if "cannot keep the KV" in r.getMessage()]
        budget = llm.config.kv_cache_bytes
        assert f"30-token context: it takes {30 * per_token}" in note and f"kv_cache_bytes={budget}" in note
    finally:
        llm.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        llm = genlm_core.load("mlx", model=str(tiny_llama_path), kv_cache_bytes=0)
    try:
        assert llm.prefix_cache is None
        assert llm.next_token_logprobs_sync([1, 2, 3]).shape == (1024,)
    finally:
        llm.close()


@pytest.mark.asyncio
async def test_greedy_sampling_follows_argmax(llm):
    prompt = [5, 6, 7]
    out = await llm.sample(prompt, max_tokens=4, eos_token_ids=[], temperature=0.0)
    ctx = list(prompt)
    for tok in out:
        assert tok == int(torch.argmax(llm.next_token_logprobs_sync(ctx)))
        ctx.append(tok)


@pytest.mark.asyncio
async def test_sampling_seeds_and_default_eos(llm):
    prompt = [11, 12]
    a = await llm.sample(prompt, max_tokens=8, eos_token_ids=[], seed=5)
    b = await llm.sample(prompt, max_tokens=8, eos_token_ids=[], seed=6)
    assert a != b  # different seeds, different draws (2 layers, peaky random weights)
    assert llm.eos_token_ids == [0]
    free = await llm.sample(prompt, max_tokens=8, seed=5)  # default EOS: the tokenizer's
    assert 0 not in free
    assert await llm.sample(prompt, max_tokens=0) == []


@pytest.mark.asyncio
async def test_sampling_stops_at_the_context_limit(llm):
    limit = llm.max_context_length
    assert limit == 255  # 256 positions: the predicted token needs one (genlm_core.engine.checkpoint)
    # the core's clamp, the same on every engine: the last token is drawn from the row of a
    # context of `limit` tokens, so a prompt of limit - 3 tokens leaves room for 4
    out = await llm.sample([5] * (limit - 3), max_tokens=10, eos_token_ids=[], seed=0)
    assert len(out) == 4


@pytest.mark.asyncio
async def test_bad_inputs_fail_alone(llm):
    good = [5, 6, 7]
    expected = llm.next_token_logprobs_sync(good)
    for bad in ([], [-1], [1024], [1.5], "abc", [0] * 257, None):
        with pytest.raises(ValueError):
            llm.next_token_logprobs_sync(bad)
        with pytest.raises(ValueError):
            await llm.next_token_logprobs(bad)
        with pytest.raises(ValueError):
            await llm.sample(bad, max_tokens=2)
    with pytest.raises(ValueError):
        await llm.sample(good, max_tokens=-1)
    with pytest.raises(ValueError):
        llm.cache_kv([-3])
    llm.clear_cache()
    res = await asyncio.gather(
        llm.next_token_logprobs(good), llm.next_token_logprobs([5000]), return_exceptions=True
    )
    assert isinstance(res[1], ValueError)
    assert_tiny_close(res[0], expected)


def test_bfloat16_model_gives_float32(tiny_llama_path):
    import mlx.core as mx
    from genlm_mlx.engine import MLXEngine
    from mlx_lm import load

    from genlm_core.engine import BaseLogprobBackend

    model, tok = load(str(tiny_llama_path))
    model.set_dtype(mx.bfloat16)
    llm = BaseLogprobBackend(MLXEngine(model, tok))
    ref = genlm_core.load("mlx", model=str(tiny_llama_path))
    try:
        ctx = [5, 6, 7, 8]
        lp = llm.next_token_logprobs_sync(ctx)
        assert lp.dtype == torch.float32 and torch.isfinite(lp).all()
        assert float(torch.logsumexp(lp.double(), 0).exp()) == pytest.approx(1.0, abs=1e-4)
        # bf16 weights and activations against float32: the derived bound for one path in
        # each dtype (bf16 storage rounding, 2^-8 per stored value, dominates)
        assert_rows_close(
            lp, ref.next_token_logprobs_sync(ctx), tiny_shape(), dtype="bfloat16", other_dtype="float32"
        )
        (kept,) = llm.prefix_cache.deepest_kv(ctx)[1].segments  # the context's own KV, in bf16
        assert isinstance(kept, mx.array) and kept.dtype == mx.bfloat16 and kept.shape[3] == len(ctx)
    finally:
        llm.close()
        ref.close()


def test_unreusable_caches_warn_and_still_compute(tiny_llama_path):
    from genlm_mlx import prefill
    from genlm_mlx.engine import MLXEngine
    from mlx_lm import load
    from mlx_lm.models.cache import ArraysCache, RotatingKVCache

    from genlm_core.engine import BaseLogprobBackend

    model, tok = load(str(tiny_llama_path))
    ctxs = _contexts(5, 3, 1, 12)
    plain = BaseLogprobBackend(MLXEngine(model, tok))
    expected = [plain.next_token_logprobs_uncached(c) for c in ctxs]
    plain.close()
    # Sliding window with pinned tokens (keep > 0): not reusable, not batchable.
    model.make_cache = lambda: [RotatingKVCache(max_size=512, keep=4) for _ in model.layers]
    with pytest.warns(UserWarning, match="prefix caching is disabled"):
        llm = BaseLogprobBackend(MLXEngine(model, tok))
    try:
        assert llm.prefix_cache is None and "keep=4" in llm.engine.kv_reuse_problem
        rows = llm.batch_next_token_logprobs_sync(ctxs)
        for exp, row in zip(expected, rows):
            assert_tiny_close(row, exp)
    finally:
        llm.close()

    class Recurrent:
        layers = [0, 0]

        def make_cache(self):
            return [ArraysCache(2), ArraysCache(2)]

    assert "recurrent" in prefill.kv_reuse_problem(Recurrent())
    # no warning when the user turned prefix caching off
    model.make_cache = lambda: [RotatingKVCache(max_size=512, keep=4) for _ in model.layers]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off = genlm_core.backend_config("mlx", prefix_cache=False)
        BaseLogprobBackend(MLXEngine(model, tok, off), off).close()
