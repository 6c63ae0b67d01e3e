"""kv_cache_bytes bounds every byte of genlm-hf's KV, and every value that cannot be a
bound says so.

* The pool never passes its bound: a context longer than the bound holds alone is refused
  for its caller (a ValueError naming kv_cache_bytes and the bytes that context needs),
  the others of its batch get their rows, and the engine keeps serving; contexts that fit
  alone but not together run in parts. Rows are checked against the uncached model.
* ``0`` keeps no KV between calls and gives the pool's memory back after each call.
* ``True``, ``1``, more than the machine has: a sentence naming the option, the value and
  the fix, at load.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import torch
from hf_helpers import column_bytes, load_hf

from genlm_core.testing.tolerance import assert_tiny_close

PAGE = 16


def _uncached(llm: Any, contexts: list[tuple[int, ...]]) -> torch.Tensor:
    return llm.rows.finalize(torch.stack(llm.engine.forward_uncached(contexts)))


def _text(rng: random.Random, n: int, V: int) -> tuple[int, ...]:
    return tuple(rng.randrange(3, V) for _ in range(n))


def test_a_context_the_bound_cannot_hold_is_refused_for_its_caller_only(tiny_llama_path: str) -> None:
    """A bound of 8 pages holds a context of 96 tokens alone: 97 is refused before it reaches
    the engine, with the option and the size it needs; the batch it joined gets its rows."""
    page_bytes = PAGE * column_bytes(tiny_llama_path)
    bound = 8 * page_bytes + 100  # not a whole number of pages: the sentence names it as given
    llm = load_hf(tiny_llama_path, kv_cache_bytes=bound, cache_size=0, batch_size=8)
    try:
        assert llm.max_context_length == 6 * PAGE  # 8 pages: the reserved one, a copy on write
        rng = random.Random(0)
        V = llm.vocab_size
        fits, too_long = _text(rng, 96, V), _text(rng, 97, V)
        with pytest.raises(ValueError, match=rf"kv_cache_bytes.*{9 * page_bytes}") as err:
            llm.next_token_logprobs_sync(too_long)
        assert "97 tokens" in str(err.value) and "raise it in load()" in str(err.value)
        assert f"kv_cache_bytes={bound})" in str(err.value)

        async def together() -> list[Any]:
            return await asyncio.gather(
                llm.next_token_logprobs(fits), llm.next_token_logprobs(too_long), return_exceptions=True
            )

        good, bad = asyncio.run(together())
        assert isinstance(bad, ValueError) and "kv_cache_bytes" in str(bad)
        assert_tiny_close(good[None], _uncached(llm, [fits]))
        assert llm.engine.pool.nbytes <= bound
        again = llm.batch_next_token_logprobs_sync([fits[:50], fits])  # still serving
        assert_tiny_close(again, _uncached(llm, [fits[:50], fits]))
    finally:
        llm.close()


def test_the_bound_holds_when_particles_outgrow_it(tiny_llama_path: str) -> None:
    """A prompt and 8 particles over a bound that holds the prompt but not every particle's
    own tokens: the pool stays within the bound (it grew 2-8x past it before), every row
    is exact, and the call runs in parts."""
    page_bytes = PAGE * column_bytes(tiny_llama_path)
    bound = 12 * page_bytes
    llm = load_hf(tiny_llama_path, kv_cache_bytes=bound, cache_size=0, batch_size=16)
    try:
        rng = random.Random(1)
        V = llm.vocab_size
        prompt = _text(rng, 100, V)
        particles = [prompt + _text(rng, 20, V) for _ in range(8)]
        for _ in range(6):
            rows = llm.batch_next_token_logprobs_sync(particles)
            assert (
                llm.engine.pool.nbytes <= bound and llm.engine.pool.pages_in_use < llm.engine.pool.max_pages
            )
            assert_tiny_close(rows, _uncached(llm, particles))
            particles = [c + (rng.randrange(3, V),) for c in particles]
        assert llm.stats()["engine"]["pool_passes"] > 6  # parts: not every particle fits at once
    finally:
        llm.close()


def test_zero_keeps_nothing_and_gives_the_memory_back(tiny_llama_path: str) -> None:
    """kv_cache_bytes=0: no reuse, a bounded pool (it was unbounded), and after each call the
    pool's written pages go back (it kept 188 MB after one batch on SmolLM2)."""
    llm = load_hf(tiny_llama_path, kv_cache_bytes=0, cache_size=0)
    try:
        pool = llm.engine.pool
        assert pool.max_pages is not None  # the 'auto' bound holds the running call
        rng = random.Random(2)
        ctxs = [_text(rng, 200, llm.vocab_size) for _ in range(8)]
        rows = llm.batch_next_token_logprobs_sync(ctxs)
        assert_tiny_close(rows, _uncached(llm, ctxs))
        stats = llm.stats()["engine"]
        assert stats["tokens_reused"] == 0 and stats["kv_pool_pages_in_use"] == 0
        assert stats["kv_pool_bytes_touched"] == pool.page_bytes  # the reserved page only
        assert llm.batch_next_token_logprobs_sync(ctxs).equal(rows)  # the same pass again
    finally:
        llm.close()


def test_clear_cache_gives_the_memory_back(tiny_llama_path: str) -> None:
    llm = load_hf(tiny_llama_path, cache_size=0)
    try:
        rng = random.Random(3)
        llm.batch_next_token_logprobs_sync([_text(rng, 200, llm.vocab_size) for _ in range(4)])
        assert llm.stats()["engine"]["kv_pool_bytes_touched"] > 50 * llm.engine.pool.page_bytes
        llm.clear_cache()
        assert llm.stats()["engine"]["kv_pool_bytes_touched"] == llm.engine.pool.page_bytes
    finally:
        llm.close()


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc (Linux)")
def test_trim_gives_back_free_pages_and_keeps_the_pages_in_use() -> None:
    """A pool of 256 MiB on the CPU: 200 MiB of pages written, all but the first context
    released, trim: the process's RSS drops by most of what was released, and the context
    still held reads back its values."""
    from genlm_hf.pool import KVLayout, KVPool, KVSeq

    layout = KVLayout(layers=4, heads=4, head_dim=64, dtype=torch.float32, device=torch.device("cpu"))
    pool = KVPool(layout, 256 << 20)
    held = KVSeq(pool)
    slots = held.extend(3 * PAGE)
    values = torch.randn(4, 2, 4, len(slots), 64)
    pool.storage[:, :, :, slots] = values
    others = [KVSeq(pool) for _ in range(50)]
    for seq in others:
        pool.storage[:, :, :, seq.extend(3 * PAGE)] = 1.0  # written: resident
    written = 50 * 3 * pool.page_bytes
    before = _rss()
    for seq in others:
        seq.release()
    freed = pool.trim()
    assert freed == written and pool.touched == 1 + 3  # the reserved page and the held context's
    assert before - _rss() > 0.8 * written
    assert pool.storage[:, :, :, slots].equal(values)
    again = KVSeq(pool)  # the pages given back are taken again, lowest first
    pool.storage[:, :, :, again.extend(PAGE)] = 2.0
    assert again.pages == [4] and pool.storage[:, :, :, held.slots()].equal(values)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (True, "is a bool"),
        (False, "is a bool"),
        (1, "holds less than 4 pages"),
        (10**15, "more than this machine's memory"),
    ],
)
def test_budget_values_that_cannot_be_a_bound_say_so(tiny_llama_path: str, value: Any, words: str) -> None:
    with pytest.raises(Exception, match="kv_cache_bytes") as err:
        load_hf(tiny_llama_path, kv_cache_bytes=value)
    assert words in str(err.value)


def test_a_bound_just_past_the_machines_memory_says_so(tiny_llama_path: str) -> None:
    from genlm_hf.pool_budget import device_memory

    total, _ = device_memory(torch.device("cpu"))
    with pytest.raises(ValueError, match=f"kv_cache_bytes={total + 1} is more than this machine's memory"):
        load_hf(tiny_llama_path, kv_cache_bytes=total + 1)
