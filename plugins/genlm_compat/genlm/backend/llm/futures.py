"""genlm-backend's helpers for failing the futures of a batch (``genlm.backend.llm.base``).

genlm-core's batcher (:class:`genlm_core.engine.batching.AutoBatcher`) fails its own
callers; these remain for code that batches futures itself."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from genlm.backend._surface import public_dir  # noqa: E402

__all__ = ["BatchAbandoned", "batch_abandoned", "fail_futures"]


class BatchAbandoned(RuntimeError):
    """The caller holding a batch died before it could be dispatched."""


def batch_abandoned(exc: BaseException) -> BatchAbandoned:
    """The failure to hand to callers whose batch leader died (``exc`` is its cause,
    never handed on itself: a ``CancelledError`` would cancel callers who never asked)."""
    abandoned = BatchAbandoned(f"batch leader did not survive it: {exc!r}")
    abandoned.__cause__ = exc
    return abandoned


def fail_futures(entries: Iterable[Any], exc: BaseException) -> None:
    """Fail each entry's future (its last element) with ``exc`` unless it is done."""
    for entry in entries:
        future = entry[-1]
        if not future.done():
            future.set_exception(exc)


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
