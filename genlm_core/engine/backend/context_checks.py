"""The checks every context gets before any work: ids of the vocabulary, within the
context limit, on an open backend (:func:`~genlm_core.engine.validation.validate_context`).
A part of :class:`~genlm_core.engine.backend.BaseLogprobBackend` (its ``context_checks``);
the other parts check through the backend's ``validate``, so a subclass refining it (as
genlm-compat's do: genlm-backend's error classes) holds for every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from genlm_core.engine.checkpoint import positions_entry, positions_limit
from genlm_core.engine.contexts import Context
from genlm_core.engine.validation import RecentContexts, validate_context

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.engine.backend.lifecycle import Lifecycle
    from genlm_core.engine.checkpoint import Checkpoint

__all__ = ["ContextChecks", "limit_reason"]

#: the fix every sentence below ends with, where the model could take the context whole
_TRUNCATE = "truncate the context (keep its last tokens)"


def limit_reason(engine: Any, checkpoint: Checkpoint) -> Callable[[int], str | None]:
    """What bounds a context of ``tokens`` tokens past the backend's limit, and the fix, for
    the caller's ``ValueError`` (one sentence per bound, the same for every engine):

    1. the engine's own sentence (``context_limit_error``: a KV budget, its option and the
       size the context needs);
    2. the engine's positions, where they bind below the model's window: the load() option
       that sets them (``max_positions_option``: vLLM ``max_model_len``, llama.cpp ``n_ctx``);
    3. the model's window: the checkpoint's key that states it (``max_position_embeddings``
       in config.json, ``context_length`` in a GGUF's metadata).

    None where none applies (the core's general sentence then)."""
    own = getattr(engine, "context_limit_error", None)
    option = getattr(engine, "max_positions_option", None)
    window = checkpoint.max_context_length
    entry = positions_entry(checkpoint.config) if window is not None else None

    def reason(tokens: int) -> str | None:
        why = own(tokens) if own is not None else None
        if why:
            return why
        engine_limit = positions_limit(getattr(engine, "max_positions", None))
        if option and engine_limit is not None and tokens > engine_limit:
            if window is None or engine_limit < window:
                model = f"; the model's own window holds {window} tokens" if window is not None else ""
                return (
                    f"this backend's {option} option sets its limit ({engine_limit} tokens and the "
                    f"predicted one){model}: raise {option} in load(), or {_TRUNCATE}"
                )
        if entry is not None and window is not None and tokens > window:
            key, n = entry
            where = (
                f"the GGUF's context_length, {n}"
                if checkpoint.kind == "gguf"
                else f"{key}={n} in its config.json"
            )
            return (
                f"the model's window is {n} positions ({where}): {window} tokens and the predicted "
                f"one; {_TRUNCATE}, or use a model with a longer window"
            )
        return None

    return reason


class ContextChecks:
    """``validate``: a context as a tuple of ints, or a clear ``ValueError``.

    Args:
        lifecycle: whether the backend is open (a closed one checks nothing: it refuses).
        vocab_size: the vocabulary's size: the ids a context may hold.
        context_limit: the longest context accepted, read at each check (None: no limit):
            the backend's ``max_context_length``, which a subclass may widen.
        limit_error: the engine's own message for a context over its limit (None: the core's).
    """

    def __init__(
        self,
        lifecycle: Lifecycle,
        vocab_size: int,
        context_limit: Callable[[], int | None],
        limit_error: Callable[[int], str | None] | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self.vocab_size = vocab_size
        self.context_limit = context_limit
        self.limit_error = limit_error
        #: the contexts validated lately: validation checks a particle's new id only
        self.recent = RecentContexts()

    def validate(self, token_ids: Any) -> Context:
        """The context as a tuple of ints, or a clear ``ValueError``."""
        self.lifecycle.check_open()
        return validate_context(
            token_ids,
            self.vocab_size,
            self.context_limit(),
            recent=self.recent,
            limit_error=self.limit_error,
        )
