"""How tokenizers spell bytes in their token strings, and back.

* Byte-level BPE (GPT-2 and its descendants) writes every byte as one printable
  character of GPT-2's :func:`bytes_to_unicode` table (``Ġ`` = space, ``Ċ`` = newline);
  :func:`map_byte_level` reads such strings back to bytes.
* Sentencepiece writes a space as ``▁`` and, with byte fallback, a lone byte as the
  piece ``<0xNN>``; :func:`map_sentencepiece` reads those.
* For ``str_vocab``, bytes that are not valid UTF-8 are written the tokenizer's way
  again (:func:`byte_level_str`, :func:`byte_piece_str`) or with U+FFFD
  (:func:`replace_str`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

SPIECE_UNDERLINE = "\u2581"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters.

    Printable Latin-1 bytes map to themselves; the others (control characters, space,
    ``\\xa0``, soft hyphen) map to ``chr(256 + k)`` in order, so space is ``Ġ`` and
    newline is ``Ċ``.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def _byte_level_table() -> dict[int, int | str]:
    """``str.translate`` table: byte-level character -> the Latin-1 character of its byte.

    Latin-1 characters that are *not* byte-level characters (space, newline...) map to a
    character outside Latin-1, so ``encode("latin-1")`` fails on strings that are not
    byte-level.
    """
    table: dict[int, int | str] = {ord(c): b for b, c in bytes_to_unicode().items()}
    for b in range(256):
        table.setdefault(b, "\U0010ffff")
    return table


def map_byte_level(pieces: Iterable[str | None]) -> list[bytes | None]:
    table = _byte_level_table()
    out: list[bytes | None] = []
    for p in pieces:
        if p is None:
            out.append(None)
            continue
        try:
            out.append(p.translate(table).encode("latin-1"))
        except UnicodeEncodeError:
            # Not byte-level text (unreachable through byte-level pre-tokenisation):
            # keep its UTF-8 text; the round-trip check guards the result.
            out.append(p.encode("utf-8"))
    return out


def map_sentencepiece(
    pieces: Iterable[str | None], byte_fallback: bool, underline: str = SPIECE_UNDERLINE
) -> list[bytes | None]:
    out: list[bytes | None] = []
    for p in pieces:
        if p is None:
            out.append(None)
        elif byte_fallback and len(p) == 6 and _BYTE_PIECE.fullmatch(p):
            out.append(bytes([int(p[3:5], 16)]))
        else:
            out.append(p.replace(underline, " ").encode("utf-8"))
    return out


def byte_level_str(b: bytes) -> str:
    """The byte-level BPE's own token string ("ðŁ" for b"\\xf0\\x9f")."""
    table = bytes_to_unicode()
    return "".join(table[x] for x in b)


def byte_piece_str(b: bytes) -> str:
    """The sentencepiece byte-fallback piece ("<0xF0>"); only single bytes are invalid."""
    return f"<0x{b[0]:02X}>" if len(b) == 1 else replace_str(b)


def replace_str(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")
