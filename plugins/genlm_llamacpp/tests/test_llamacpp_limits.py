"""llama.cpp's limits as a user meets them, through the conformance kit's check
(:func:`genlm_core.testing.limits.check_context_limit`: the message names the context's
length, the limit, the option that sets it and the fix; the calls beside a refused context
get their rows; its prefixes are computed as from a cleared cache; a context of exactly
the limit is accepted):

* ``kv_cells`` below ``n_ctx``: the cells bound a context (the message names kv_cells and
  the cells that context needs);
* ``n_ctx`` below the model's window (256 positions): the message names n_ctx;
* ``kv_cache_tokens`` below one prompt: the prompt is computed (rows exact), not kept, and
  one warning names the option, the size that prompt needs and the fix.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import genlm_core
from genlm_core.testing.limits import check_context_limit
from genlm_core.testing.tolerance import assert_rows_close, model_shape

#: the tiny Llama GGUF's window: 256 positions, contexts of 255 tokens
WINDOW = 255


def _close(backend: Any, got: Any, want: Any, what: str) -> None:
    assert_rows_close(got, want, model_shape(backend), dtype=backend.dtype, what=what)


def _load(tiny_gguf: Any, **options: Any) -> Any:
    return genlm_core.load(
        "llamacpp", model=str(tiny_gguf), kv_cache_type="f32", n_threads=2, cache_size=0, **options
    )


@pytest.mark.parametrize(
    ("options", "limit", "names"),
    [
        ({"kv_cells": 100}, 99, "kv_cells=100, fewer cells than n_ctx=256 positions"),
        ({"n_ctx": 48}, 47, "this backend's n_ctx option sets its limit (47 tokens"),
    ],
)
def test_an_option_below_the_window_is_named(tiny_gguf: Any, options: dict, limit: int, names: str) -> None:
    llm = _load(tiny_gguf, **options)
    try:
        assert llm.max_context_length == limit
        ids = list(range(3, llm.vocab_size))
        with pytest.raises(ValueError, match=rf"{limit + 1} tokens but at most {limit} fit") as err:
            llm.next_token_logprobs_sync(ids[: limit + 1])
        assert names in str(err.value), str(err.value)
        check_context_limit(llm, ids, WINDOW, _close, at_limit_max=limit)
    finally:
        llm.close()


def test_a_prompt_larger_than_the_prefix_budget_is_computed_and_said_once(
    tiny_gguf: Any, caplog: pytest.LogCaptureFixture
) -> None:
    llm = _load(tiny_gguf, kv_cache_tokens=24)
    try:
        prompt = list(range(10, 50))  # 40 tokens: more than the whole budget
        contexts = [prompt + [t] for t in (60, 61, 62)]
        with caplog.at_level(logging.WARNING, logger="genlm"):
            first = llm.batch_next_token_logprobs_sync([prompt, *contexts])
            again = llm.batch_next_token_logprobs_sync([c + [7] for c in contexts])
        for ctx, row in zip([prompt, *contexts], first):
            _close(
                llm, row, llm.next_token_logprobs_uncached(ctx), f"{len(ctx)} tokens over a 24-token budget"
            )
        for ctx, row in zip(contexts, again):
            _close(llm, row, llm.next_token_logprobs_uncached(ctx + [7]), "the next step")
        assert llm.kv_calls.reuse.oversized >= 1
        (warning,) = [r.getMessage() for r in caplog.records if "cannot keep the KV" in r.getMessage()]
        assert "kv_cache_tokens=24" in warning and "Raise kv_cache_tokens in load() to at least" in warning
        short = llm.next_token_logprobs_sync(prompt[:10])  # still serving, and keeping what fits
        _close(llm, short, llm.next_token_logprobs_uncached(prompt[:10]), "a context within the budget")
    finally:
        llm.close()
