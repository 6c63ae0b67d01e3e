"""Many particles on one llama.cpp context: each batch is planned against free KV
sequences and cells before it decodes, so particles that extend their own context by a
token compute that token only, resampled particles copy their parent's prefix, and no
decode is retried for want of a slot."""

from __future__ import annotations

import asyncio
import random

import torch
from genlm_llamacpp.kv_cells import CellLedger

import genlm_core
from genlm_core.testing.tolerance import assert_tiny_close

PARTICLES = 64
STEPS = 64


def test_ledger_counts_shared_cells_once() -> None:
    led = CellLedger(100)
    led.extend(0, 10)  # sequence 0: positions 0..9
    led.copy(0, 1, 6)  # sequence 1 shares the first 6 cells
    led.extend(1, 3)
    assert led.used == 13 and led.tokens(1) == 9
    assert led.freed_by_removing(0) == 4 and led.freed_by_removing(1) == 3
    led.remove(0)
    assert led.used == 9  # the 6 shared cells stay: sequence 1 still uses them
    led.copy(1, 2, 9)
    led.remove(1)
    assert led.used == 9 and led.freed_by_removing(2) == 9
    led.remove(2)
    assert led.used == 0 and led.free == 100


def test_64_particles_64_tokens_compute_little_more_than_the_new_tokens(tiny_gguf) -> None:
    """SMC-like: 64 particles each extend their context by one token per step, with a
    resampling every 8 steps (a few particles replaced by copies of others). Tokens
    computed stay within 1.1x the tokens that are new (the prompt once, then one per
    particle per step); rows agree with the uncached path."""
    llm = genlm_core.load("llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2, cache_size=0)
    rng = random.Random(0)
    prompt = [rng.randrange(1, 1000) for _ in range(6)]
    particles = [list(prompt) for _ in range(PARTICLES)]

    async def step() -> list[torch.Tensor]:
        return await asyncio.gather(*(llm.next_token_logprobs(p) for p in particles))

    try:
        start = llm.stats()["engine"]
        new_tokens = len(prompt)
        for k in range(STEPS):
            if k and k % 8 == 0:  # resample: a quarter of the particles copy another one
                for j in rng.sample(range(PARTICLES), PARTICLES // 4):
                    particles[j] = list(particles[rng.randrange(PARTICLES)])
            for p in particles:
                p.append(rng.randrange(1, 1000))
            new_tokens += len({tuple(p) for p in particles})
            rows = asyncio.run(step())
        end = llm.stats()["engine"]
        computed = end["tokens_computed"] - start["tokens_computed"]
        assert computed <= 1.1 * new_tokens, (computed, new_tokens)
        # the last step's rows are right (float32 sums in another batch shape: the derived bound)
        for p, row in list(zip(particles, rows))[:8]:
            assert_tiny_close(row, llm.next_token_logprobs_uncached(p))
    finally:
        llm.close()


def test_live_contexts_beyond_the_cells_are_planned_not_retried(tiny_gguf) -> None:
    """16 particles growing to 90 tokens in 512 cells (a small n_ctx=512 cache): the
    live contexts outgrow the cells; every batch is planned (one decode per n_batch
    tokens of each part the core runs, no failed decode), and rows stay right."""
    llm = genlm_core.load(
        "llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2, kv_cells=512, cache_size=0
    )
    rng = random.Random(1)
    particles = [[rng.randrange(1, 1000) for _ in range(10)] for _ in range(16)]
    try:
        for _ in range(80):
            for p in particles:
                p.append(rng.randrange(1, 1000))
            before = llm.stats()["engine"]
            splits = llm.kv_calls.counts["call_parts_split"]
            rows = llm.batch_next_token_logprobs_sync(particles)
            after = llm.stats()["engine"]
            parts = 1 + llm.kv_calls.counts["call_parts_split"] - splits  # (a split part runs in two)
            tokens = after["tokens_computed"] - before["tokens_computed"]
            decodes = after["decode_calls"] - before["decode_calls"]
            assert decodes <= -(-tokens // llm.engine.context.n_batch) + parts  # no retries
        for p, row in list(zip(particles, rows))[:4]:
            assert_tiny_close(row, llm.next_token_logprobs_uncached(p))
    finally:
        llm.close()


def test_a_shorter_prefix_of_an_extended_sequence_is_copied_not_extended(tiny_gguf) -> None:
    """A sequence extended in place keeps serving its shorter prefix. When one batch holds
    a context continuing that shorter prefix and one continuing the sequence's end, only
    the second may extend the sequence in place; the first copies the prefix (extending
    the sequence at the shorter position would ask llama.cpp to decode position 4 of a
    sequence that holds 0..7, which it refuses). Rows equal the uncached path."""
    llm = genlm_core.load("llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2, cache_size=0)
    try:
        prompt = [5, 17, 29, 41, 53, 65, 77, 89]
        llm.next_token_logprobs_sync(prompt[:4])  # a sequence holding 4 positions
        llm.next_token_logprobs_sync(prompt)  # the same sequence extended in place to 8
        computed = llm.stats()["engine"]["tokens_computed"]
        short, long = prompt[:4] + [101], prompt + [102]
        rows = llm.batch_next_token_logprobs_sync([short, long])
        assert llm.stats()["engine"]["tokens_computed"] - computed == 2  # both reused their prefix
        for ctx, row in zip((short, long), rows):
            # same float32 weights and KV entries; only llama.cpp's batch shapes differ:
            # the derived bound (genlm_core.testing.tolerance), as in the conformance kit
            assert_tiny_close(row, llm.next_token_logprobs_uncached(ctx))
    finally:
        llm.close()


def test_storing_a_chunk_never_frees_a_sequence_it_just_extended(tiny_gguf) -> None:
    """A prefix budget smaller than the particles' contexts: storing one context's entry
    evicts the older entry that held another context's sequence, which that context has
    just extended in place. The sequence stays (it was freed, and its cells removed, so the
    next step decoded positions 13.. into an empty sequence: ``llama_decode`` -1). Every
    step's rows agree with the uncached path."""
    from genlm_core.testing.burst import SMCProgram

    llm = genlm_core.load(
        "llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2, n_seq_max=4, n_batch=3,
        kv_cache_tokens=24, cache_size=0, batch_size=3,
    )  # fmt: skip
    rng = random.Random(5)
    prompt = [rng.randrange(1, 1000) for _ in range(10)]
    try:
        for seed in (0, 1):
            llm.clear_cache()
            program = SMCProgram(prompt, llm.eos_token_ids, n=6, max_tokens=6, seed=seed)
            seen = []
            while live := program.live():
                contexts = [program.context(i) for i in live]
                rows = llm.batch_next_token_logprobs_sync(contexts)
                seen += zip(contexts, rows)
                program.advance(rows, live)
            for ctx, row in seen:  # afterwards: the uncached path empties the KV cache
                assert_tiny_close(row, llm.next_token_logprobs_uncached(ctx))
    finally:
        llm.close()
