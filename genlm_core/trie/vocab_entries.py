"""What a trie accepts as its vocabulary, read into plain bytes and positions.

A vocabulary is any sequence of entries: ``Token`` objects (any ids, distinct),
bytes-like objects, sequences of byte values ``0..255``, or *symbols*: objects that
iterate to themselves alone (genlm-control's ``EndOfSequence``), each one edge from the
root keyed by the object. :func:`raw_bytes` reads such a sequence once into what
:class:`~genlm_core.trie.structure.TrieStructure` builds on (bytes, token id and
symbol of each position); :func:`select_ids` turns the ``eos_tokens`` /
``atomic_tokens`` arguments into positions; :func:`to_tokens` is the public helper
that makes ``Token`` objects of a plain byte vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from genlm_core.token import Token

__all__ = ["to_tokens"]


def to_tokens(decode: Iterable[bytes | Token]) -> list[Token]:
    """Turn a byte vocabulary into ``Token`` objects; plain ``bytes`` get their
    position as id, ``Token`` entries keep theirs."""
    out: list[Token] = []
    for i, t in enumerate(decode):
        if isinstance(t, Token):
            out.append(t)
        elif isinstance(t, (bytes, bytearray, memoryview)):
            out.append(Token(i, bytes(t)))
        else:
            raise TypeError(f"vocabulary entry {i} is {type(t).__name__}, expected bytes or Token")
    return out


def _is_symbol(x: Any) -> bool:
    """An object that iterates to itself alone (genlm-control's ``EndOfSequence``):
    one trie edge labelled with the object."""
    try:
        it = list(iter(x)) if not isinstance(x, (str, bytes, bytearray, memoryview)) else None
    except TypeError:
        return False
    return it is not None and len(it) == 1 and it[0] is x


def raw_bytes(decode: Iterable[Any]) -> tuple[list[bytes], list[Any], np.ndarray, dict[Any, int]]:
    """Per position: the plain bytes (``b""`` for a symbol), the entry itself (plain
    bytes become ``Token(position, bytes)`` on first read of ``decode``, so the list
    holds ``None`` there), the token id (a ``Token``'s own id, a plain entry's
    position, ``-1`` for a symbol),
    and ``symbol -> position`` for entries that are one-edge symbols.

    Entries: ``Token`` (any id; ids must be distinct), bytes-like, a sequence of
    ints in ``0..255`` (taken as those bytes), or a symbol that iterates to itself."""
    items = list(decode)
    raw: list[bytes] = []
    entries: list[Any] = []
    idl: list[int] = []
    symbols: dict[Any, int] = {}
    for i, t in enumerate(items):
        if isinstance(t, Token):
            idl.append(t.token_id)
            raw.append(bytes(t))
            entries.append(t)
            continue
        entries.append(None)
        idl.append(i)
        if isinstance(t, (bytes, bytearray, memoryview)):
            raw.append(bytes(t))
        elif _is_symbol(t):
            if t in symbols:
                raise ValueError(f"vocabulary entry {i} ({t!r}) repeats entry {symbols[t]}")
            symbols[t] = i
            idl[i] = -1  # a symbol has no token id
            raw.append(b"")
            entries[i] = t
        else:
            try:
                b = bytes(list(t))
            except (TypeError, ValueError):
                raise TypeError(
                    f"vocabulary entry {i} is {type(t).__name__} ({t!r}): expected a Token, bytes, a "
                    "sequence of byte values 0..255, or a symbol that iterates to itself"
                ) from None
            raw.append(b)
    ids = np.array(idl, dtype=np.int64)
    real = ids[ids >= 0]
    if len(np.unique(real)) != len(real):
        u, c = np.unique(real, return_counts=True)
        raise ValueError(f"vocabulary token ids must be distinct; repeated: {u[c > 1][:5].tolist()}")
    return raw, entries, ids, symbols


def select_ids(
    spec: Iterable[Any], tokens: list[bytes], what: str, id2pos: Any, symbols: dict[Any, int]
) -> np.ndarray:
    """Positions named by ``spec``: a ``Token`` names its id, plain ``bytes`` every
    entry with those bytes, a symbol itself. Unknown entries raise ``ValueError``."""
    by_bytes: dict[bytes, list[int]] | None = None
    ids: set[int] = set()
    for s in spec:
        if isinstance(s, Token):
            pos = id2pos(s.token_id)
            if pos is None or tokens[pos] != bytes(s):
                raise ValueError(f"{what} token {s!r} not in vocabulary")
            ids.add(pos)
        elif isinstance(s, (bytes, bytearray, memoryview)):
            if by_bytes is None:
                by_bytes = {}
                for i, t in enumerate(tokens):
                    by_bytes.setdefault(t, []).append(i)
                for i in symbols.values():  # a symbol's b"" placeholder is not bytes
                    by_bytes[b""].remove(i)
            found = by_bytes.get(bytes(s))
            if not found:
                raise ValueError(f"{what} token {bytes(s)!r} not in vocabulary")
            ids.update(found)
        elif _is_symbol(s) and s in symbols:
            ids.add(symbols[s])
        else:
            raise TypeError(f"{what} tokens must be bytes, Token or a vocabulary symbol, got {s!r}")
    return np.array(sorted(ids), dtype=np.int64)
