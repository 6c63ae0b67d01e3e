"""Exceptions that carry genlm-core's messages and the classes genlm-backend raised.

genlm-core refuses bad input with a ``ValueError`` that names the problem and the fix.
genlm-backend let the engine fail instead: an id outside the vocabulary or a context
longer than the model's window was an ``IndexError`` (the embedding lookup), a float id
a ``RuntimeError``. These classes are both, so the clear message reaches code that
catches either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from genlm.backend._surface import public_dir  # noqa: E402

__all__ = ["ContextWindowError", "NonIntegerTokenIdError", "TokenIdRangeError", "reference_error"]


class TokenIdRangeError(ValueError, IndexError):
    """A token id outside the vocabulary (or negative), or a context longer than the
    model's window."""


class ContextWindowError(TokenIdRangeError):
    """``sample`` reached the end of the model's window before ``max_tokens`` tokens;
    ``tokens`` holds the tokens drawn until then."""

    def __init__(self, message: str, tokens: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.tokens = list(tokens)


class NonIntegerTokenIdError(ValueError, RuntimeError):
    """A token id that is not an integer (a float, a bool)."""


def _non_integer(token_ids: Any) -> bool:
    try:
        items = list(token_ids)
    except TypeError:
        return False
    return any(isinstance(t, bool) or not hasattr(t, "__index__") for t in items)


def reference_error(exc: ValueError, token_ids: Any) -> ValueError:
    """genlm-core's context error ``exc`` as the class genlm-backend raised for
    ``token_ids`` (an empty context stays a plain ``ValueError``, as there)."""
    if type(exc) is not ValueError or isinstance(token_ids, (str, bytes)):
        return exc
    try:
        empty = len(token_ids) == 0
    except TypeError:
        return exc
    if empty:
        return exc
    cls = NonIntegerTokenIdError if _non_integer(token_ids) else TokenIdRangeError
    new = cls(str(exc))
    new.__cause__ = None
    return new


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
