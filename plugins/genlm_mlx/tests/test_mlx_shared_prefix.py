"""Rows that extend one prompt read its KV once (genlm_mlx.shared_prefix): every row the
uncached model's, the KV held the minimum (the prompt once, each particle's own tokens),
prompts of several programs in one call, and a model whose attention would ignore the
shared prompt refused rather than answered wrongly."""

from __future__ import annotations

import sys

import pytest
import torch

import genlm_core
from genlm_core.testing.tolerance import assert_tiny_close

PROMPT = 60
PARTICLES = 6
STEPS = 5


def _tokens(seed: int, n: int, vocab: int = 1000) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n,), generator=g).tolist()


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def arch_path(request, tiny_llama_path, tiny_gpt2_path):
    return {"llama": tiny_llama_path, "gpt2": tiny_gpt2_path}[request.param]


def _load(path, **options):
    return genlm_core.load("mlx", model=str(path), cache_size=0, **options)


def test_particles_hold_the_prompt_once(arch_path):
    llm = _load(arch_path)
    try:
        prompt = _tokens(0, PROMPT)
        llm.next_token_logprobs_sync(prompt)
        unit = llm.prefix_cache.stats()["kv_bytes"] / PROMPT  # one token's KV
        particles = [list(prompt) for _ in range(PARTICLES)]
        asked: list[tuple[list[int], torch.Tensor]] = []
        for step in range(STEPS):
            for i, p in enumerate(particles):
                p.append(1 + (37 * i + 11 * step) % 900)
            if step == 3:  # a resampling: particles 0 and 1 take over, their tails shared
                particles = [list(particles[i % 2]) for i in range(PARTICLES)]
                for i, p in enumerate(particles):
                    p.append(1 + (13 * i) % 900)
            rows = llm.batch_next_token_logprobs_sync(particles)
            asked += [(list(c), r) for c, r in zip(particles, rows)]
        # brute force: each context computes its tokens past the deepest context kept before
        # it (every context asked is kept), and holds them once: the prompt's KV is not copied
        kept, least = {tuple(prompt)}, PROMPT
        for ctx, _ in asked:
            least += len(ctx) - max(k for k in range(len(ctx)) if tuple(ctx[:k]) in kept)
            kept.add(tuple(ctx))
        assert llm.stats()["engine"]["tokens_computed"] == least
        assert llm.prefix_cache.stats()["kv_bytes"] == pytest.approx(unit * least)
        for ctx, row in asked:
            assert_tiny_close(row, llm.next_token_logprobs_uncached(ctx))
    finally:
        llm.close()


def test_programs_with_their_own_prompts_in_one_call(tiny_llama_path):
    llm = _load(tiny_llama_path)
    try:
        prompts = [_tokens(1, 40), _tokens(2, 52), [5, 6]]
        for p in prompts:
            llm.next_token_logprobs_sync(p)
        unit = llm.prefix_cache.stats()["kv_bytes"] / sum(map(len, prompts))
        rows = [p + [t] for p in prompts for t in (3, 4, 9)] + [[7, 8, 9]]  # a fresh one too
        got = llm.batch_next_token_logprobs_sync(rows)
        for ctx, row in zip(rows, got):
            assert_tiny_close(row, llm.next_token_logprobs_uncached(ctx))
        held = sum(map(len, prompts)) + 9 + 3
        assert llm.prefix_cache.stats()["kv_bytes"] == pytest.approx(unit * held)
    finally:
        llm.close()


def test_an_attention_that_ignores_the_shared_prompt_is_refused(tiny_llama_path, monkeypatch):
    from genlm_mlx import prefill

    llm = _load(tiny_llama_path)
    try:
        model = llm.engine.mlx_model
        attn = next(m for _, m in model.named_modules() if type(m).__name__ == "Attention")
        module = sys.modules[type(attn).__module__]
        original = module.scaled_dot_product_attention.__genlm_shared_prefix__
        prompt = prefill.forward(model, [[1, 2, 3, 4]], want_kv=True).payloads[0]
        monkeypatch.setattr(module, "scaled_dot_product_attention", original)  # bypasses the prefix
        with pytest.raises(RuntimeError, match="prefix_cache=False"):
            prefill.forward(model, [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]], [prompt, prompt], share=True)
    finally:
        llm.close()
