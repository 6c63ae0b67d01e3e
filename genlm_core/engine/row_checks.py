"""The check every engine row passes before a caller, the output cache or a burst sees it.

The backend (:class:`~genlm_core.engine.backend.BaseLogprobBackend`) normalises every
engine's rows in one place; there, :func:`unreadable_rows` finds the rows that are no
distribution: a NaN score, a ``+inf`` score, or no finite score at all (every token
``-inf``). Such a row is never handed out nor cached (a NaN drawn into an SMC weight
would silently poison every particle resampled from it): its caller gets an
:class:`EngineOutputError` naming the engine, the row and what to check, and the other
rows of the batch are served.

The check is one reduction over the batch (each row's maximum: ``amax`` propagates a
NaN, a row with no finite score has a ``-inf`` maximum, a ``+inf`` score a ``+inf`` one)
and one host sync; only a batch with a bad row costs more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["EngineOutputError", "row_error", "unreadable_rows"]

#: tokens of a context shown in an error (its last ones)
_SHOWN_TOKENS = 8


class EngineOutputError(RuntimeError):
    """An engine returned scores no caller may read (a row of the wrong shape, a NaN, no
    finite score): the message names the engine, the row and what to check."""


def unreadable_rows(scores: "torch.Tensor | Sequence[torch.Tensor]") -> list[int]:
    """Indices of the rows of ``scores`` (a ``(rows, vocab)`` tensor, or a list of rows)
    holding a NaN or ``+inf``, or no finite score; ``[]`` for a healthy batch."""
    import torch

    if isinstance(scores, torch.Tensor):
        top = scores.amax(dim=-1)
    elif len(scores) == 0:
        return []
    else:  # each row's maximum (public API only; a batch is tens of rows), one sync below
        top = torch.stack([r.amax() for r in scores])
    finite = torch.isfinite(top)
    if bool(finite.all()):
        return []
    return [int(i) for i in (~finite).nonzero().view(-1).tolist()]


def _what(row: "torch.Tensor") -> str:
    import torch

    nans = int(torch.isnan(row).sum())
    if nans:
        return f"a row with {nans} NaN score(s)"
    if bool(torch.isposinf(row).any()):
        return "a row with a +inf score"
    return "a row with no finite score (every token -inf)"


def _context(context: Sequence[int]) -> str:
    if len(context) <= _SHOWN_TOKENS:
        return f"context {tuple(context)}"
    tail = ", ".join(map(str, context[-_SHOWN_TOKENS:]))
    return f"context of {len(context)} tokens ending ..., {tail}"


def row_error(
    backend_name: str, engine: Any, index: int, context: Sequence[int], row: "torch.Tensor", call: str
) -> EngineOutputError:
    """The error for row ``index`` of a batch (its engine scores ``row``, of ``context``),
    returned by the engine's ``call`` (``"forward"``, ``"decode_step"``)."""
    cls = type(engine).__name__
    return EngineOutputError(
        f"{backend_name}: the engine {cls} returned {_what(row)} for row {index} of its batch "
        f"({_context(context)}); such a row is no distribution, so no caller gets it and it is "
        "not cached (the batch's other rows are served). A NaN or inf usually means the model "
        "overflowed its dtype (load it with dtype='float32') or a bug in "
        f"{cls}.{call}() for this context; every token -inf means the engine masked them all."
    )
