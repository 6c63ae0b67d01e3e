"""Telling the user about long work: progress bars, status notes, and engines' repeated
log lines summarised once.

* :func:`progress_bar` - a tqdm bar on stderr (or a no-op bar), used by SIS and the
  byte-level beam.
* :func:`note` - a status line on the ``genlm`` logger: INFO for "what is happening
  now", WARNING for advice worth showing to every user (Python's last-resort handler
  prints WARNING records to stderr even when logging is not configured). The
  ``genlm`` command shows INFO notes too (:func:`show_notes`).
* :func:`summarise_repeats` - while an engine starts, a log call site that fires
  again and again (vLLM warns once per weight tensor when it casts float32 weights to
  bfloat16) is shown ``keep`` times; the rest are counted and reported in one line.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["LOGGER_NAME", "RepeatSummary", "note", "progress_bar", "show_notes", "summarise_repeats"]

LOGGER_NAME = "genlm"
logger = logging.getLogger(LOGGER_NAME)


def note(message: str, *, advice: bool = False) -> None:
    """Report what is happening (INFO) or advice every user should see (WARNING)."""
    logger.log(logging.WARNING if advice else logging.INFO, message)


@contextlib.contextmanager
def show_notes(stream: Any = None) -> Iterator[logging.Handler]:
    """Print every note (INFO too) on ``stream`` (stderr) while the block runs: the
    ``genlm`` command's setting. Notes then go there only, not to the root logger."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("[genlm] %(message)s"))
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


class _NoBar:
    def update(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


def progress_bar(total: int | None, desc: str, unit: str, show: bool = True) -> Any:
    """A tqdm bar on stderr that disappears when closed; a no-op bar when ``show`` is
    false or tqdm is missing."""
    if not show:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return _NoBar()
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr)


class RepeatSummary(logging.Filter):
    """Pass the first ``keep`` records of each call site (logger, file, line) under
    ``prefix``; count the rest. Records of ERROR and above always pass."""

    def __init__(self, prefix: str, keep: int = 2) -> None:
        super().__init__()
        self.prefix = prefix
        self.keep = keep
        self.seen: dict[tuple[str, str, int], int] = {}
        self.example: dict[tuple[str, str, int], tuple[int, str]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or not (
            record.name == self.prefix or record.name.startswith(self.prefix + ".")
        ):
            return True
        site = (record.name, record.pathname, record.lineno)
        count = self.seen[site] = self.seen.get(site, 0) + 1
        if count == self.keep + 1:
            self.example[site] = (record.levelno, record.getMessage())
        return count <= self.keep

    def suppressed(self) -> list[tuple[int, int, str]]:
        """``(count, level, first suppressed message)`` per call site that was cut short."""
        return [(n - self.keep, *self.example[site]) for site, n in self.seen.items() if n > self.keep]


@contextlib.contextmanager
def summarise_repeats(prefix: str, keep: int = 2) -> Iterator[RepeatSummary]:
    """Summarise repeated log lines of loggers under ``prefix`` (e.g. ``"vllm"``) while
    the block runs; on exit, one note per cut-short call site says how many were hidden.

    The filter sits on the handlers that print those records: the ``prefix`` logger's
    own and the root logger's, and any handler the ``prefix`` logger gets while the
    block runs (vLLM replaces its handler with ``dictConfig`` when an engine starts).
    """
    summary = RepeatSummary(prefix, keep)
    owner = logging.getLogger(prefix)
    filtered: list[logging.Handler] = []

    def attach(handler: logging.Handler) -> None:
        if summary not in handler.filters:
            handler.addFilter(summary)
            filtered.append(handler)

    for h in [*owner.handlers, *logging.getLogger().handlers]:
        attach(h)
    patched = owner.__dict__.get("addHandler")
    add_handler = owner.addHandler

    def add_and_attach(handler: logging.Handler) -> None:
        add_handler(handler)
        attach(handler)

    owner.addHandler = add_and_attach  # type: ignore[method-assign]
    try:
        yield summary
    finally:
        if patched is None:
            owner.__dict__.pop("addHandler", None)
        else:
            owner.addHandler = patched  # type: ignore[method-assign]
        for h in filtered:
            h.removeFilter(summary)
        for count, level, example in summary.suppressed():
            text = example if len(example) <= 160 else example[:157] + "..."
            kind = "warnings" if level >= logging.WARNING else "log lines"
            note(
                f"{prefix}: {count} more similar {kind} suppressed, like: {text}",
                advice=level >= logging.WARNING,
            )
