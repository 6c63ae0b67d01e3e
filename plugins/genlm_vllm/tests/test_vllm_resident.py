"""The resident path on vLLM (CPU): an ordinary call whose context extends a live row's
continues that row's engine request (a streaming-input session) and runs only its new
tokens; identical contexts share a row; the live rows are bounded (count, tokens, idle
time, least recently extended first); another caller's calls, a cache reset, a LoRA
switch and close keep the rows the uncached model's; ``resident=False`` is today's path.

Rows are compared with the uncached model's (``next_token_logprobs_uncached``: a fresh
prefill reading no prefix-cache block) within the bound derived from float32 rounding
(:func:`genlm_core.testing.tolerance.assert_backend_close`): a decode over kept KV and a
fresh prefill differ by the order of their sums only.
"""

from __future__ import annotations

import pytest
import torch

from genlm_core.testing.tolerance import assert_backend_close

PROMPT = [1, 45, 496, 173, 701] + list(range(100, 140))  # 45 tokens: a full 32-block and a tail


def assert_uncached(llm, contexts, rows) -> None:
    for ctx, row in zip(contexts, rows):
        ref = llm.next_token_logprobs_uncached(list(ctx))
        assert_backend_close(llm, row, ref, f"a resident row of ...{list(ctx[-3:])}")


def engine_stats(llm) -> dict:
    return dict(llm.stats()["engine"])


def call(llm, contexts) -> torch.Tensor:
    """One batch through the backend's batcher (no output-cache hit: fresh contexts)."""
    return llm.batch_next_token_logprobs_sync([list(c) for c in contexts])


def delta(after: dict, before: dict, key: str) -> int:
    return after[key] - before[key]


@pytest.fixture
def llm(tiny_backend):
    tiny_backend.clear_cache()
    assert tiny_backend.stats()["engine"]["resident"] is True  # on by default
    rows = tiny_backend.engine.resident.rows
    saved = (rows.max_rows, rows.idle_s, rows.clock)
    yield tiny_backend
    rows.max_rows, rows.idle_s, rows.clock = saved
    tiny_backend.clear_cache()


def particles(n: int, depth: int = 0) -> list[tuple[int, ...]]:
    return [tuple(PROMPT) + (200 + i,) + tuple(range(300, 300 + depth)) for i in range(n)]


def test_the_next_call_on_a_context_plus_one_token_runs_one_token(llm) -> None:
    first = particles(4)
    call(llm, first)
    before = engine_stats(llm)
    nxt = [c + (7,) for c in first]
    rows = call(llm, nxt)
    after = engine_stats(llm)
    assert delta(after, before, "tokens_computed") == 4  # one token a row
    assert delta(after, before, "tokens_reused") == 4 * len(first[0])  # the rows' kept KV
    assert delta(after, before, "rows_resumed") == 4 and delta(after, before, "rows_restarted") == 0
    assert after["resident_rows"] == 4
    assert_uncached(llm, nxt, rows)
    # a few tokens more continue the row too
    more = [c + (8, 9, 10) for c in nxt]
    before = engine_stats(llm)
    rows = call(llm, more)
    assert delta(engine_stats(llm), before, "tokens_computed") == 12
    assert_uncached(llm, more, rows)


def test_identical_contexts_share_a_row(llm) -> None:
    ctx = particles(1)[0]
    before = engine_stats(llm)
    out = llm.engine.forward([ctx, ctx, ctx])
    after = engine_stats(llm)
    assert out.shape[0] == 3 and torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])
    assert delta(after, before, "rows_restarted") == 1 and after["resident_rows"] == 1
    # two particles that shared the row diverge: one continues it, the other restarts
    a, b = ctx + (5,), ctx + (6,)
    before = engine_stats(llm)
    rows = call(llm, [a, b])
    after = engine_stats(llm)
    assert delta(after, before, "rows_resumed") == 1 and delta(after, before, "rows_restarted") == 1
    assert after["resident_rows"] == 2
    assert_uncached(llm, [a, b], rows)


def test_live_rows_are_bounded_least_recently_extended_first(llm) -> None:
    llm.engine.resident.rows.max_rows = 2
    a, b, c = particles(3)
    call(llm, [a])
    call(llm, [b])
    call(llm, [a + (1,)])  # a is now the most recently extended
    before = engine_stats(llm)
    call(llm, [c])
    after = engine_stats(llm)
    assert after["resident_rows"] == 2 and delta(after, before, "resident_evicted") == 1
    # b was evicted: its next call restarts; a's continues
    before = engine_stats(llm)
    rows = call(llm, [a + (1, 2), b + (3,)])
    after = engine_stats(llm)
    assert delta(after, before, "rows_resumed") == 1 and delta(after, before, "rows_restarted") == 1
    assert after["resident_rows"] == 2
    assert_uncached(llm, [a + (1, 2), b + (3,)], rows)
    # a call with more fresh contexts than the bound: the excess runs once and ends
    fresh = particles(5, depth=2)
    assert_uncached(llm, fresh, call(llm, fresh))
    assert engine_stats(llm)["resident_rows"] == 2
    assert llm.engine.llm.llm_engine.get_num_unfinished_requests() == 2


def test_idle_rows_end_at_the_next_call(llm) -> None:
    now = [0.0]
    rows = llm.engine.resident.rows
    rows.idle_s, rows.clock = 10.0, lambda: now[0]
    a, b = particles(2)
    call(llm, [a, b])
    now[0] = 5.0
    call(llm, [a + (1,)])
    now[0] = 12.0  # b idle for 12 s, a for 7
    before = engine_stats(llm)
    out = call(llm, [a + (1, 2), b + (3,)])
    after = engine_stats(llm)
    assert delta(after, before, "resident_expired") == 1
    assert delta(after, before, "rows_resumed") == 1 and delta(after, before, "rows_restarted") == 1
    assert_uncached(llm, [a + (1, 2), b + (3,)], out)


def test_other_callers_and_cache_resets_keep_the_numbers(llm) -> None:
    """A particle loop with another caller's uncached rows and other contexts between its
    calls (the rows stay live: they resume), then a cache reset (they restart)."""
    ctxs = particles(3)
    seen = []
    call(llm, ctxs)
    for step in range(4):
        llm.next_token_logprobs_uncached(list(PROMPT[:10]))  # another caller, no session
        call(llm, [tuple(range(400, 420 + step))])  # another caller's own row
        before = engine_stats(llm)
        ctxs = [c + (10 + step,) for c in ctxs]
        rows = call(llm, ctxs)
        after = engine_stats(llm)
        assert delta(after, before, "rows_resumed") == 3, step
        seen += list(zip(ctxs, rows))
    llm.clear_cache()
    assert engine_stats(llm)["resident_rows"] == 0
    before = engine_stats(llm)
    ctxs = [c + (50,) for c in ctxs]
    rows = call(llm, ctxs)
    assert delta(engine_stats(llm), before, "rows_restarted") == 3
    seen += list(zip(ctxs, rows))
    # a sampler call (LLM.generate) ends the rows too; the next call restarts them
    llm.sample_sync(list(PROMPT), max_tokens=2, seed=0)
    assert engine_stats(llm)["resident_rows"] == 0
    ctxs = [c + (51,) for c in ctxs]
    seen += list(zip(ctxs, call(llm, ctxs)))
    assert_uncached(llm, [c for c, _ in seen], [r for _, r in seen])


def test_a_lora_switch_never_continues_a_row_of_the_other_model(tiny_lora_backend, tiny_lora_adapter) -> None:
    llm = tiny_lora_backend
    llm.clear_cache()
    llm.load_lora(tiny_lora_adapter, "resident")
    ctx = tuple(PROMPT[:20])
    try:
        call(llm, [ctx])  # the base model's row
        llm.set_lora("resident")
        before = engine_stats(llm)
        lora_rows = call(llm, [ctx + (3,)])
        assert delta(engine_stats(llm), before, "rows_restarted") == 1  # not the base row
        assert_uncached(llm, [ctx + (3,)], lora_rows)
        llm.clear_lora()
        before = engine_stats(llm)
        base_rows = call(llm, [ctx + (4,)])  # the base row is live still: it continues
        assert delta(engine_stats(llm), before, "rows_resumed") == 1
        assert_uncached(llm, [ctx + (4,)], base_rows)
        assert float((lora_rows - base_rows).abs().max()) > 1e-2  # the adapter changed the rows
    finally:
        llm.clear_lora()
        llm.clear_cache()


def test_switched_off_and_close(tiny_path) -> None:
    """``resident=False``: every call a new request from its prompt (today's path), the
    same rows; and close() with live rows (the resident path switched on by hand)."""
    from genlm_vllm.sessions import ResidentSessions

    import genlm_core

    llm = genlm_core.load(
        "vllm",
        model=tiny_path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_batched_tokens=32,
        resident=False,
        engine_opts={"block_size": 32},
    )
    try:
        stats = engine_stats(llm)
        assert stats["resident"] is False and "rows_resumed" not in stats
        first = particles(2)
        call(llm, first)
        before = engine_stats(llm)
        nxt = [c + (7,) for c in first]
        rows = call(llm, nxt)
        # the tail past the last full 32-token block is prefilled again: 46 - 32 a row
        assert delta(engine_stats(llm), before, "tokens_computed") == 2 * (len(nxt[0]) - 32)
        assert_uncached(llm, nxt, rows)
        engine = llm.engine
        engine.resident = ResidentSessions(engine, 4, None)
        call(llm, [c + (8,) for c in nxt])  # fresh contexts (the output cache holds the others)
        assert engine_stats(llm)["resident_rows"] == 2
        assert engine.llm.llm_engine.get_num_unfinished_requests() == 2
    finally:
        llm.close()
    assert len(engine.resident.rows) == 0 and engine.llm is None


def test_a_direct_generate_on_the_vllm_llm_ends_the_rows_first(llm) -> None:
    """Code holding the ``vllm.LLM`` (``llm.llm.generate``) would otherwise wait forever on
    the live sessions; the rows restart after it, same numbers."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    ctxs = particles(2)
    call(llm, ctxs)
    assert engine_stats(llm)["resident_rows"] == 2
    with llm.engine_lock:
        out = llm.llm.generate(
            [TokensPrompt(prompt_token_ids=list(PROMPT))], SamplingParams(max_tokens=1), use_tqdm=False
        )
        assert len(out) == 1 and llm.llm.reset_prefix_cache() in (True, None)
    assert engine_stats(llm)["resident_rows"] == 0
    nxt = [c + (5,) for c in ctxs]
    before = engine_stats(llm)
    rows = call(llm, nxt)
    assert delta(engine_stats(llm), before, "rows_restarted") == 2
    assert_uncached(llm, nxt, rows)
