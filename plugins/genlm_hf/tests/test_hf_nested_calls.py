"""Calls whose contexts nest or fork off each other before any of their prefixes is kept
(a fresh engine, a cleared cache, a budget that released them), at 1k-4k tokens.

Such a call used to run one pass (and one recursion level) per token, up to a
RecursionError at ~1,000 tokens. Now it runs in rounds (genlm_core.engine.call_plan): a context
nested in another is read off its row, a long new prefix several contexts share runs
once, first. Each call is checked three ways: every row against the uncached model (one
full pass per context, at the bound derived from the arithmetic), the tokens computed
against the call's prefix tree counted token by token, and the passes against the levels
of branching (never one per token).
"""

from __future__ import annotations

import json
import random
import shutil
from typing import Any

import pytest
import torch
from hf_helpers import load_hf

from genlm_core.testing.tolerance import assert_rows_close, model_shape

Context = tuple[int, ...]


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny Llama with 8,192 positions (its weights: rope has no learnt positions)."""
    from genlm_core.testing import models

    path = tmp_path_factory.mktemp("long-llama")
    shutil.copytree(models.tiny_llama(), path, dirs_exist_ok=True)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 8192
    (path / "config.json").write_text(json.dumps(config))
    llm = load_hf(str(path), cache_size=0, batch_size=64)
    yield llm
    llm.close()


def _uncached(llm: Any, contexts: list[Context]) -> torch.Tensor:
    return llm.rows.finalize(torch.stack(llm.engine.forward_uncached(contexts)))


def _minimum(contexts: list[Context]) -> int:
    """Tokens a fresh call must compute: the distinct non-empty prefixes of its contexts."""
    return len({c[:n] for c in contexts for n in range(1, len(c) + 1)})


def _call(llm: Any, contexts: list[Context]) -> tuple[torch.Tensor, int, int]:
    """(rows, tokens computed, passes) of one call on a cleared cache."""
    llm.clear_cache()
    before = dict(llm.stats()["engine"])
    rows = llm.batch_next_token_logprobs_sync(contexts)
    after = llm.stats()["engine"]
    return (
        rows,
        after["tokens_computed"] - before["tokens_computed"],
        after["pool_passes"] - before["pool_passes"],
    )


def _check_rows(llm: Any, contexts: list[Context], rows: torch.Tensor, what: str) -> None:
    assert_rows_close(rows, _uncached(llm, contexts), model_shape(llm), what=what)


def _text(rng: random.Random, n: int, V: int) -> Context:
    return tuple(rng.randrange(3, V) for _ in range(n))


def test_a_context_and_its_extension_are_one_pass(long_llama: Any) -> None:
    rng = random.Random(0)
    ctx = _text(rng, 300, long_llama.vocab_size)
    contexts = [ctx[:299], ctx]
    rows, tokens, passes = _call(long_llama, contexts)
    assert (tokens, passes) == (300, 1)
    _check_rows(long_llama, contexts, rows, "a context and its extension")


def test_a_continuation_scored_in_one_batch_computes_each_token_once(long_llama: Any) -> None:
    """A 300-token prompt and a 31-token continuation scored token by token, in one call:
    331 tokens in one pass (it was 314 passes and 10,096 tokens)."""
    rng = random.Random(1)
    prompt, cont = _text(rng, 300, long_llama.vocab_size), _text(rng, 31, long_llama.vocab_size)
    contexts = [prompt + cont[:k] for k in range(32)]
    rng.shuffle(contexts)
    rows, tokens, passes = _call(long_llama, contexts)
    assert (tokens, passes) == (331, 1)
    _check_rows(long_llama, contexts, rows, "a scored continuation")


@pytest.mark.parametrize("n", [940, 997, 1000, 1100, 4000])
def test_siblings_of_a_long_new_prompt(long_llama: Any, n: int) -> None:
    """P+[a,b], P+[a,c], P+[d,e]: P once, then the three rows (at 997 tokens this raised
    RecursionError; at 940 it took 912 passes)."""
    rng = random.Random(n)
    V = long_llama.vocab_size
    p = _text(rng, n, V)
    a, b, c, d, e = rng.sample(range(3, V), 5)
    contexts = [p + (a, b), p + (a, c), p + (d, e)]
    rows, tokens, passes = _call(long_llama, contexts)
    assert passes == 2
    assert tokens == _minimum(contexts) + 1  # `a` twice: shared by two rows, below MIN_COMMON
    _check_rows(long_llama, contexts, rows, f"siblings of a {n}-token prompt")


def test_a_program_that_clears_its_cache_at_step_one_keeps_working(long_llama: Any) -> None:
    """A 997-token prompt, 4 particles, the cache cleared after the first step: every later
    step is exact (every row failed after the RecursionError)."""
    rng = random.Random(7)
    V = long_llama.vocab_size
    prompt = _text(rng, 997, V)
    particles = [prompt + (t,) for t in rng.sample(range(3, V), 4)]
    for step in range(4):
        if step == 1:
            long_llama.clear_cache()
        rows = long_llama.batch_next_token_logprobs_sync(particles)
        _check_rows(long_llama, particles, rows, f"step {step}")
        particles = [c + (rng.randrange(3, V),) for c in particles]


@pytest.mark.parametrize("seed", range(4))
def test_forks_of_forks_and_nested_contexts_at_1k_to_4k_tokens(long_llama: Any, seed: int) -> None:
    """A random tree: a prompt of 1k-3k tokens, continuations forking off it and off each
    other at random depths, some contexts prefixes of others. Rows exact; tokens at most
    the prefix tree's count plus what siblings below MIN_COMMON share; passes bounded by
    the tree's levels of branching."""
    from genlm_core.engine.call_plan import MIN_COMMON

    rng = random.Random(seed)
    V = long_llama.vocab_size
    contexts: list[Context] = [_text(rng, rng.randint(1000, 3000), V)]
    while len(contexts) < 10:
        base = rng.choice(contexts)
        cut = rng.randint(len(base) // 2, len(base))
        if rng.random() < 0.3:
            contexts.append(base[:cut])
        else:
            contexts.append(base[:cut] + _text(rng, rng.choice([1, 5, 40, 300, 1000]), V))
        contexts = list(dict.fromkeys(c for c in contexts if len(c) <= 4096))
    rows, tokens, passes = _call(long_llama, contexts)
    want = _minimum(contexts)
    assert want <= tokens <= want + (MIN_COMMON - 1) * len(contexts)
    assert passes <= len(contexts)  # rounds: levels of branching (and pass_groups' splits)
    _check_rows(long_llama, contexts, rows, f"a random tree (seed {seed})")


def test_the_pass_counters_are_reported(long_llama: Any) -> None:
    stats = long_llama.stats()["engine"]
    assert stats["pool_passes"] > 0 and stats["call_rounds"] > 0


def test_no_call_recurses(long_llama: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call runs in rounds and parts (the core's, over the engine's rows), never by
    calling forward again."""
    kv_calls = long_llama.kv_calls
    calls = []
    real = type(kv_calls).forward

    def counted(self: Any, contexts: list[Context]) -> torch.Tensor:
        calls.append(len(contexts))
        return real(self, contexts)

    monkeypatch.setattr(type(kv_calls), "forward", counted)
    rng = random.Random(11)
    p = _text(rng, 1200, long_llama.vocab_size)
    _call(long_llama, [p + (5,), p + (6, 7), p[:600], p[:600] + (9,) * 40])
    assert calls == [4]
