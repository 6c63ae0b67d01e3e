"""What a decoded vocabulary is, and how the per-family results become one.

Each tokenizer family's reader (:mod:`.tiktoken_ranks`, :mod:`.fast_tokenizers`,
:mod:`.slow_tokenizers`) returns a :class:`Raw`: the family name, the bytes of each
id (``None`` for a gap) and the special ids. :func:`finish` turns it into the public
:class:`DecodedVocab` (gaps filled with :data:`GAP_BYTES`, ``Token`` objects, the
string forms).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from genlm_core.engine.vocab.token_strings import byte_level_str, byte_piece_str, replace_str
from genlm_core.token import Token

GAP_BYTES = b""
"""Placeholder bytes for ids in the id space that no token uses."""

# the tokenizer families (``DecodedVocab.family``)
BYTE_LEVEL = "byte_level"
SENTENCEPIECE = "sentencepiece"
TIKTOKEN = "tiktoken"
RAW = "raw"


@dataclass(frozen=True)
class DecodedVocab:
    """A decoded vocabulary with what was learnt on the way."""

    byte_vocab: list[Token]
    str_vocab: list[str]
    family: str
    """``"byte_level"``, ``"sentencepiece"``, ``"tiktoken"`` or ``"raw"``."""
    special_ids: frozenset[int]
    """Ids of added/special tokens (encoded as their UTF-8 text)."""
    gap_ids: frozenset[int]
    """Ids no token uses (bytes :data:`GAP_BYTES`)."""


@dataclass
class Raw:
    """Family-independent intermediate result: the bytes of each id (None: a gap)."""

    family: str
    values: list[bytes | None]
    special_ids: set[int]


def values_by_id(by_id: Mapping[int, bytes], length: int) -> list[bytes | None]:
    values: list[bytes | None] = [None] * max(length, max(by_id, default=-1) + 1)
    for i, b in by_id.items():
        values[i] = b
    return values


def finish(raw: Raw) -> DecodedVocab:
    values = raw.values
    gaps = [i for i, b in enumerate(values) if b is None]
    for i in gaps:
        values[i] = GAP_BYTES
    byte_vocab = list(map(Token, range(len(values)), values))
    fallback = _STR_FALLBACKS.get(raw.family, replace_str)
    str_vocab = [_to_str(b, fallback) for b in values]  # type: ignore[arg-type]
    return DecodedVocab(byte_vocab, str_vocab, raw.family, frozenset(raw.special_ids), frozenset(gaps))


@contextmanager
def gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _to_str(b: bytes, fallback: Callable[[bytes], str]) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return fallback(b)


_STR_FALLBACKS: dict[str, Callable[[bytes], str]] = {
    BYTE_LEVEL: byte_level_str,
    SENTENCEPIECE: byte_piece_str,
}
