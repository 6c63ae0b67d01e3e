"""The conformance kit's check of a context past the backend's limit
(:meth:`~genlm_core.testing.conformance.LogprobBackendConformance.test_context_past_the_limit`).

A context one token longer than ``max_context_length`` is refused for its caller, on every
path (sync, async, a batch, sampling), with a ``ValueError`` that names the limit (the
number and what sets it: the model's window, or the load() option that lowered it - a KV
budget such as genlm-hf's ``kv_cache_bytes``, llama.cpp's ``kv_cells`` or ``n_ctx``,
vLLM's ``max_model_len``) and the fix. The calls it joined get their rows, the contexts
it shares a prefix with are computed as on a fresh engine (nothing of it was cached),
and a context of exactly the limit is accepted. The expected rows come from the backend
itself, computed before the bad calls and again after every cache is cleared.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from genlm_core.testing.checkpoints import CheckpointSource

__all__ = ["check_context_limit", "checkpoint_window", "check_limit_message"]

#: words of a fix: raise the option, or shorten / truncate the context
FIXES = ("raise ", "truncate", "shorten")


def checkpoint_window(source: CheckpointSource) -> int | None:
    """The longest context the checkpoint's own files allow (None: they state none, or the
    backend loads no model), read the way the kit's checkpoint policy reads them."""
    from genlm_core.engine import checkpoint

    if source.kind == "none":
        return None
    if source.kind == "gguf":
        from genlm_core.engine.gguf_metadata import read_gguf_metadata

        return checkpoint.context_limit(read_gguf_metadata(source.path).checkpoint_config())
    return checkpoint.context_limit(checkpoint.read_config(source.path))


def option_names(backend: Any) -> set[str]:
    """The load() options of the backend's config class (its pydantic fields)."""
    fields = getattr(type(getattr(backend, "config", None)), "model_fields", None) or {}
    return set(fields)


def check_limit_message(message: str, backend: Any, limit: int, tokens: int, window: int | None) -> None:
    """The refusal of a ``tokens``-token context names the context's length, the limit, what
    sets it and a fix. What sets it: below the model's window (``window``), one of the
    backend's load() options; at the window, the model's window; a backend with no
    checkpoint of its own (a mock, a client of a server), an option, the model or the server."""
    where = f"{type(backend).__name__}'s refusal of a {tokens}-token context: {message!r}"
    assert f"{tokens} tokens" in message, f"{where} does not say how long the context is"
    assert str(limit) in message, f"{where} does not name the limit ({limit} tokens)"
    assert any(f in message for f in FIXES), f"{where} names no fix (one of {FIXES})"
    named = sorted(o for o in option_names(backend) if o in message)
    if window is not None and limit < window:
        assert named, (
            f"{where}: the limit ({limit}) is below the model's window ({window}), so a load() option "
            "set it, and the message must name it"
        )
    elif window is not None:
        assert "window" in message, f"{where} does not say the model's window sets the limit"
    else:
        assert named or "model" in message or "server" in message, f"{where} does not say what sets the limit"


def check_context_limit(
    backend: Any,
    ids: Sequence[int],
    window: int | None,
    assert_close: Callable[[Any, Any, Any, str], None],
    at_limit_max: int,
) -> None:
    """The whole check (module docstring). ``ids``: ordinary token ids to build contexts of;
    ``window``: the checkpoint's own limit (:func:`checkpoint_window`); ``at_limit_max``:
    the longest limit whose at-the-limit context is computed (the refusals are checked at
    every limit). A backend without a limit has nothing to refuse."""
    limit = backend.max_context_length
    if limit is None:
        return
    rng = random.Random(17)
    too_long = [rng.choice(ids) for _ in range(limit + 1)]
    # contexts sharing a prefix with it, the longest just within the limit where it is cheap
    n = min(limit, at_limit_max)
    near = sorted({min(2, n), min(5, n), max(1, n // 2), n})
    good = [too_long[:k] for k in near]
    good.append(too_long[: min(3, n)] + [rng.choice(ids)] if n > 3 else [rng.choice(ids)])
    backend.clear_cache()
    want = [backend.next_token_logprobs_sync(c) for c in good]

    with pytest.raises(ValueError) as err:
        backend.next_token_logprobs_sync(too_long)
    check_limit_message(str(err.value), backend, limit, limit + 1, window)
    with pytest.raises(ValueError):
        backend.batch_next_token_logprobs_sync([good[0], too_long])
    if hasattr(backend, "sample"):
        with pytest.raises(ValueError):
            asyncio.run(backend.sample(too_long, max_tokens=1, seed=0))

    async def together() -> list[Any]:
        calls = [backend.next_token_logprobs(c) for c in good]
        calls.insert(len(calls) // 2, backend.next_token_logprobs(too_long))
        return await asyncio.gather(*calls, return_exceptions=True)

    got = asyncio.run(together())
    bad = got.pop(len(good) // 2)
    assert isinstance(bad, ValueError), f"the over-limit context among good ones gave {bad!r}"
    check_limit_message(str(bad), backend, limit, limit + 1, window)
    for i, (row, exp) in enumerate(zip(got, want)):
        assert not isinstance(row, BaseException), (
            f"a good context ({len(good[i])} tokens) beside it failed: {row!r}"
        )
        assert_close(backend, row, exp, f"a {len(good[i])}-token context beside an over-limit one")

    # nothing of it was kept: its prefixes, one token on, as on a fresh engine
    after = [c + [ids[0]] for c in good if len(c) < n]
    first = backend.batch_next_token_logprobs_sync(after)
    backend.clear_cache()
    fresh = backend.batch_next_token_logprobs_sync(after)
    assert_close(
        backend, first, fresh, "the prefixes of a refused context, extended, against a cleared cache"
    )
