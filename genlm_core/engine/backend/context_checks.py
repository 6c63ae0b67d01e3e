"""The checks every context gets before any work: ids of the vocabulary, within the
context limit, on an open backend (:func:`~genlm_core.engine.validation.validate_context`).
A part of :class:`~genlm_core.engine.backend.BaseLogprobBackend` (its ``context_checks``);
the other parts check through the backend's ``validate``, so a subclass refining it (as
genlm-compat's do: genlm-backend's error classes) holds for every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from genlm_core.engine.contexts import Context
from genlm_core.engine.validation import RecentContexts, validate_context

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.engine.backend.lifecycle import Lifecycle

__all__ = ["ContextChecks"]


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
