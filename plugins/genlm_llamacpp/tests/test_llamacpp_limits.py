"""llama.cpp's limits as a user meets them, through the conformance kit's check
(:func:`genlm_core.testing.limits.check_context_limit`: the message names the context's
length, the limit, the option that sets it and the fix; the calls beside a refused context
get their rows; its prefixes are computed as from a cleared cache; a context of exactly
the limit is accepted):

* ``kv_cells`` below ``n_ctx``: the cells bound a context (the message names kv_cells and
  the cells that context needs);
* ``n_ctx`` below the model's window (256 positions): the message names n_ctx;
* ``kv_cache_tokens`` below one prompt is refused naming the option and the size needed
  (``test_llamacpp_backend.py``).
"""

from __future__ import annotations

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
