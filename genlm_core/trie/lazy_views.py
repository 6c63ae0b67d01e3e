"""The trie's lazy mapping views: node and leaf look-ups built on first access.

:class:`~genlm_core.trie.structure.TrieStructure` stores flat arrays only; these
views give the genlm-bytes-style mappings over them without one Python object per
node up front:

* ``children[node]``: :class:`NodeChildren`, the edges out of a node (built and cached
  on first access to that node);
* ``node2prefix[node]``: the bytes read from the root to a node;
* ``word2leaf[key]``: a ``Token``, ``(bytes, token_id)``, token id, plain bytes or a
  symbol -> its end-of-token leaf;
* ``leaf2word[leaf]`` / ``leaf2token_id[leaf]``: a leaf -> its ``Token`` (or symbol) /
  its token id.

Each view holds its structure and reads its arrays and vocabulary directly (the
views are part of the structure, split out only to keep each module short).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from genlm_core.token import Token

__all__ = ["ChildrenView", "LeafView", "Node2PrefixView", "NodeChildren", "Word2LeafView"]


class NodeChildren(dict):
    """Edges out of one node: key -> child. Keys: ``int`` bytes, ``(None, token_id)``
    end-of-token edges, atomic ``bytes``, ``EOS``. ``None`` is also accepted by
    ``get``/``[]``/``in`` (the lowest-id end-of-token leaf) without being iterated."""

    __slots__ = ("eot",)

    def __init__(self, items: list[tuple[Any, int]], eot: int | None) -> None:
        super().__init__(items)
        self.eot = eot

    def get(self, key: Any, default: Any = None) -> Any:
        if key is None:
            return self.eot if self.eot is not None else default
        return super().get(key, default)

    def __missing__(self, key: Any) -> int:
        if key is None and self.eot is not None:
            return self.eot
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        if key is None:
            return self.eot is not None
        return super().__contains__(key)

    def eot_edges(self) -> list[tuple[int, int]]:
        """``(leaf, position)`` of every end-of-token edge, ascending position."""
        return [(v, k[1]) for k, v in self.items() if isinstance(k, tuple)]


class ChildrenView(Sequence):
    """``children[node]`` -> ``dict`` of edge key -> child node (built on first access)."""

    def __init__(self, s: Any) -> None:
        self._s = s
        self._cache: list[dict | None] = [None] * s.num_nodes

    def __len__(self) -> int:
        return self._s.num_nodes

    def __getitem__(self, node: Any) -> Any:
        if isinstance(node, slice):
            return [self[i] for i in range(*node.indices(len(self)))]
        node = int(node)
        if node < 0:
            node += len(self)
        d = self._cache[node]
        if d is None:
            d = self._s._make_children(node)
            self._cache[node] = d
        return d


class Node2PrefixView(Sequence):
    """``node2prefix[node]`` -> the bytes read from the root to ``node``."""

    def __init__(self, s: Any) -> None:
        self._s = s

    def __len__(self) -> int:
        return self._s.num_nodes

    def __getitem__(self, node: Any) -> Any:
        if isinstance(node, slice):
            return [self[i] for i in range(*node.indices(len(self)))]
        return self._s.prefix(int(node))


class Word2LeafView(Mapping):
    """Token (by id), ``(bytes, token_id)``, token id (``int``), plain bytes (lowest
    position) or a symbol -> leaf node."""

    def __init__(self, s: Any) -> None:
        self._s = s
        self._by_bytes: dict[bytes, int] | None = None

    def __len__(self) -> int:
        return len(self._s._raw)

    def __iter__(self) -> Iterator[Token]:
        return iter(self._s.decode)

    def __getitem__(self, key: Any) -> int:
        s = self._s
        if isinstance(key, tuple) and len(key) == 2:  # genlm-bytes' (bytes, token_id)
            b, tid = key
            if isinstance(tid, (int, np.integer)) and isinstance(b, (bytes, bytearray, memoryview)):
                pos = s.position_of(tid)
                if pos is not None and pos not in s._symbols.values() and s._raw[pos] == bytes(b):
                    return s.n_internal + pos
            raise KeyError(key)
        if isinstance(key, Token):
            pos = s.position_of(key.token_id)
            if pos is not None and s._raw[pos] == bytes(key):
                return s.n_internal + pos
            raise KeyError(key)
        if isinstance(key, (bytes, bytearray, memoryview)):
            if self._by_bytes is None:
                m: dict[bytes, int] = {}
                sym = set(s._symbols.values())
                for i, t in enumerate(s._raw):
                    if i not in sym:
                        m.setdefault(t, i)
                self._by_bytes = m
            return s.n_internal + self._by_bytes[bytes(key)]
        if isinstance(key, (int, np.integer)):  # a token id
            pos = s.position_of(key)
            if pos is not None:
                return s.n_internal + pos
            raise KeyError(key)
        try:
            pos = s._symbols.get(key)
        except TypeError:  # unhashable
            pos = None
        if pos is not None:
            return s.n_internal + pos
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        try:
            self[key]
        except (KeyError, TypeError):
            return False
        return True


class LeafView(Mapping):
    """leaf node -> Token (``leaf2word``) or token id (``leaf2token_id``)."""

    def __init__(self, s: Any, ids: bool) -> None:
        self._s = s
        self._ids = ids

    def __len__(self) -> int:
        return len(self._s._raw)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._s.n_internal, self._s.n_internal + len(self._s._raw)))

    def __getitem__(self, leaf: Any) -> Any:
        s = self._s
        try:
            tid = int(leaf) - s.n_internal
        except (TypeError, ValueError):
            raise KeyError(leaf) from None
        if not 0 <= tid < len(s._raw):
            raise KeyError(leaf)
        return int(s.token_ids[tid]) if self._ids else s.decode[tid]

    def __contains__(self, leaf: object) -> bool:
        try:
            self[leaf]
        except KeyError:
            return False
        return True
