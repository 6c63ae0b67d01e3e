"""Flat-array layout of the token-byte trie, shared by every implementation.

Layout
------
The non-atomic tokens are sorted by their bytes (ties by token id). Every byte
prefix of a token is a trie node, and every node covers a *contiguous* range
``[start, end)`` of that sorted order: the tokens whose bytes start with the
node's prefix. Atomic tokens (one edge for the whole token) are sorted after the
non-atomic ones and each group of identical atomic bytes is one node below the
root. A node's mass is therefore a range sum (``weight_sum``) or a range max
(``weight_max``) over the permuted weight vector; no per-node Python work is
done at query time.

Node numbering (stable for a given vocabulary and options)::

    0                           root
    1 .. n_byte                 byte-prefix nodes, in depth-first pre-order
                                (children visited in byte order)
    n_byte+1 .. n_internal-1    atomic-token nodes (sorted by their bytes)
    n_internal + position       the end-of-token leaf of every vocabulary entry
                                (duplicates in bytes get distinct leaves)
    n_internal + len(vocab)     the EOS slot: the EOS node (child of the root, key
                                ``EOS``) when EOS tokens are given; otherwise no
                                node points at it and its mass is 0 (max ``-inf``)

The vocabulary is any sequence of entries: ``Token`` objects (positions need not
equal token ids; ids must be distinct), bytes, sequences of byte values, or
*symbols*: objects that iterate to themselves alone (genlm-control's
``EndOfSequence``), each one edge from the root keyed by the object, like an atomic
token. Weight vectors are indexed by position.

Edges (``children[node]`` is a :class:`NodeChildren` ``dict``): an ``int`` byte
``0..255`` to a byte node; ``(None, position)`` (``(EOT, position)``, the key of
genlm-bytes 0.2) to the end-of-token leaf of every entry ending at that node, so
duplicate byte strings keep one edge each; the whole atomic token's ``bytes`` (or
the symbol) from the root to its atomic node; :data:`EOS` (``257``) from the root
to the EOS node.
For code written against the older key, ``children[node].get(None)`` (and
``[None]``, ``None in``) answer the leaf of the lowest token id ending there;
iteration shows only the real keys.

The build is a single vectorised pass (sort, adjacent longest-common-prefix,
range ends by binary lifting over a sparse table): no Python object per node.

This module holds :class:`EOSMode` and :class:`TrieStructure` with its build (the
sorted-vocabulary geometry: :func:`_adjacent_lcp`, :func:`_next_smaller`). How the
vocabulary entries are read is in :mod:`genlm_core.trie.vocab_entries`; the mapping
views (``children``, ``node2prefix``, ``word2leaf``, ``leaf2word``) are in
:mod:`genlm_core.trie.lazy_views`. Their public names are importable from here too.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import numpy as np

from genlm_core.token import Token
from genlm_core.trie.lazy_views import ChildrenView, LeafView, Node2PrefixView, NodeChildren, Word2LeafView
from genlm_core.trie.vocab_entries import raw_bytes, select_ids, to_tokens

__all__ = [
    "EOS",
    "EOT",
    "EOSMode",
    "NodeChildren",
    "TrieMode",
    "TrieStructure",
    "coerce_mode",
    "to_tokens",
]

#: Key of the end-of-token edges in ``children`` (as in genlm-bytes).
EOT = None
#: Key of the edge from the root to the EOS node (index 257 of a 258-way byte
#: distribution: 0..255 bytes, 256 end-of-token, 257 end-of-sequence).
EOS = 257

_CODE_EOT = 256
_CODE_EOS = 257
_CODE_ATOMIC = 258


class EOSMode(enum.StrEnum):
    """How the weights of EOS tokens are aggregated.

    ``WITHOUT_EOS``: EOS tokens are ordinary tokens (their weight flows along
    their byte path and to their leaf); the EOS node gets nothing (sum 0,
    max ``-inf``).

    ``WITH_EOS``: the weight of every EOS token goes to the EOS node and to the
    root only; its byte path, atomic node and leaf do not see it.

    The root receives every token's weight in both modes.
    """

    WITHOUT_EOS = "without_eos"
    WITH_EOS = "with_eos"


#: genlm-bytes name of the same enum.
TrieMode = EOSMode


def coerce_mode(mode: Any) -> EOSMode:
    """Accept an :class:`EOSMode`, its value or name (any case), or ``None``
    (``WITHOUT_EOS``); objects with a ``.name`` (genlm-bytes' ``TrieMode``) too."""
    if mode is None:
        return EOSMode.WITHOUT_EOS
    if isinstance(mode, EOSMode):
        return mode
    name = mode if isinstance(mode, str) else getattr(mode, "name", None)
    if isinstance(name, str):
        key = name.strip().lower()
        for m in EOSMode:
            if key in (m.value, m.name.lower()):
                return m
    raise ValueError(f"unknown EOS mode {mode!r}; use EOSMode.WITH_EOS or EOSMode.WITHOUT_EOS")


def _adjacent_lcp(raw: list[bytes], lengths: np.ndarray) -> np.ndarray:
    """Longest common prefix of each sorted string with its predecessor (0 for the first)."""
    n = len(raw)
    lcp = np.zeros(n, dtype=np.int64)
    if n < 2:
        return lcp
    buf = np.frombuffer(b"".join(raw), dtype=np.uint8)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    minlen = np.minimum(lengths[1:], lengths[:-1])
    # Rows (pairs) still equal so far; compare column blocks until none is left.
    alive = np.flatnonzero(minlen > 0)
    col = 0
    block = 8
    while True:
        full = minlen[alive] <= col  # equal on the whole shorter string
        lcp[alive[full] + 1] = minlen[alive[full]]
        alive = alive[~full]
        if not alive.size:
            break
        width = int(min(block, int(minlen[alive].max()) - col))
        cols = col + np.arange(width)
        # bytes of string i+1 (cur) and i (prev) at columns col..col+width (clipped)
        valid = cols[None, :] < minlen[alive, None]
        cur_idx = offsets[alive + 1, None] + cols[None, :]
        prev_idx = offsets[alive, None] + cols[None, :]
        cur_idx = np.where(valid, cur_idx, 0)
        prev_idx = np.where(valid, prev_idx, 0)
        differ = (buf[cur_idx] != buf[prev_idx]) | ~valid
        has = differ.any(axis=1)
        first = differ.argmax(axis=1)
        done = alive[has]
        lcp[done + 1] = col + first[has]
        alive = alive[~has]
        col += width
        block = min(block * 2, 256)
    return lcp


def _next_smaller(vals: np.ndarray, pos: np.ndarray, thr: np.ndarray) -> np.ndarray:
    """For each query, the smallest ``j >= pos`` with ``vals[j] < thr`` (``len(vals)``
    when none), by binary lifting over a sparse table of minima."""
    n = len(vals)
    ext = np.concatenate([vals, np.array([np.iinfo(np.int64).min], dtype=np.int64)])
    tables = [ext]
    span = 1
    while 2 * span <= n + 1:
        prev = tables[-1]
        tables.append(np.minimum(prev[:-span], prev[span:]))
        span *= 2
    pos = pos.astype(np.int64).copy()
    for level in range(len(tables) - 1, -1, -1):
        tab = tables[level]
        step = 1 << level
        ok = pos < len(tab)
        idx = np.where(ok, pos, 0)
        skip = ok & (tab[idx] >= thr)
        pos += np.where(skip, step, 0)
    return pos


class TrieStructure:
    """The immutable node layout of a token-byte trie (see the module docstring).

    Arrays (numpy, ``int64``; ``n`` = ``len(decode)``, ``N`` = ``n_internal``):

    * ``perm[n]``: sorted position -> token id (non-atomic tokens first, by bytes).
    * ``start[N]``, ``end[N]``: each internal node covers sorted positions
      ``start:end`` (never empty).
    * ``parent[num_nodes]`` (root: -1), ``depth[num_nodes]`` (bytes read; an atomic
      node and a leaf count their whole token; leaves have their parent's depth).
    * ``eos_ids``, ``eos_pos``: EOS token ids and their sorted positions;
      ``atomic_ids``: atomic token ids.
    """

    def __init__(
        self,
        decode: Iterable[bytes | Token],
        eos_tokens: Iterable[bytes | Token] = (),
        atomic_tokens: Iterable[bytes | Token] = (),
    ) -> None:
        raw, entries, ids, symbols = raw_bytes(decode)
        n = len(raw)
        if n == 0:
            raise ValueError("cannot build a trie of an empty vocabulary")
        self._raw = raw
        self._entries = entries
        self._tokens: list[Any] | None = None
        #: token id of every position (a ``Token``'s id, else the position)
        self.token_ids = ids
        self._identity = bool(np.array_equal(ids, np.arange(n)))
        self._pos_of_id: dict[int, int] | None = (
            None if self._identity else {int(t): i for i, t in enumerate(ids.tolist()) if t >= 0}
        )
        self._symbols = symbols
        self.eos_ids = select_ids(eos_tokens or (), raw, "EOS", self.position_of, symbols)
        named_atomic = select_ids(atomic_tokens or (), raw, "atomic", self.position_of, symbols)
        self.atomic_ids = np.union1d(named_atomic, np.array(sorted(symbols.values()), dtype=np.int64))
        self.eos_tokens = frozenset(self._entry(i) for i in self.eos_ids.tolist())
        self.atomic_tokens = frozenset(self._entry(i) for i in named_atomic.tolist())

        is_atomic = np.zeros(n, dtype=bool)
        is_atomic[self.atomic_ids] = True
        plain_ids = np.flatnonzero(~is_atomic).tolist()
        plain_ids.sort(key=raw.__getitem__)  # stable: ties keep position order
        sym_pos = set(symbols.values())

        def atom_key(i: int) -> tuple[int, Any]:  # atomic bytes first (sorted), then symbols
            return (1, i) if i in sym_pos else (0, raw[i])

        atom_ids = sorted(self.atomic_ids.tolist(), key=atom_key)
        perm = np.array(plain_ids + atom_ids, dtype=np.int64)
        m = len(plain_ids)
        self.perm = perm
        self.inv_perm = np.empty(n, dtype=np.int64)
        self.inv_perm[perm] = np.arange(n)
        self.num_plain = m

        # ---- byte-prefix nodes: token k (sorted) introduces depths lcp_k+1..len_k
        sraw = [raw[i] for i in plain_ids]
        lengths = np.fromiter((len(b) for b in sraw), dtype=np.int64, count=m)
        lcp = _adjacent_lcp(sraw, lengths)
        count = lengths - lcp  # new nodes introduced by each sorted token
        first = np.ones(m, dtype=np.int64)  # id of the first node introduced by token k
        if m:
            np.cumsum(count[:-1], out=first[1:])
            first[1:] += 1
        n_byte = int(count.sum())
        intro = np.repeat(np.arange(m), count)  # introducing sorted token of each node
        node_depth = lcp[intro] + 1 + (np.arange(n_byte) - (first[intro] - 1))
        # range end: first k' > k with lcp[k'] < depth (binary lifting)
        node_end = _next_smaller(lcp, intro + 1, node_depth)
        # parent: previous node unless the node is the first one its token introduced
        node_ids = np.arange(1, n_byte + 1)
        parent_b = node_ids - 1
        is_first = node_depth == lcp[intro] + 1
        fk = intro[is_first]
        fdepth = node_depth[is_first]
        par = np.zeros(len(fk), dtype=np.int64)
        deep = fdepth > 1
        if deep.any():
            # the node at depth t=lcp_k on token k's path was introduced by the last
            # j < k with lcp_j < t (reverse next-smaller).
            t = lcp[fk[deep]]
            rev = lcp[::-1].copy()
            jrev = _next_smaller(rev, (m - 1) - fk[deep] + 1, t)
            j = (m - 1) - jrev
            par[deep] = first[j] + (t - lcp[j] - 1)
        parent_b[is_first] = par
        # edge byte into each node: byte (depth-1) of its introducing token
        offsets = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        buf = np.frombuffer(b"".join(sraw), dtype=np.uint8) if m else np.zeros(0, np.uint8)
        byte_code = buf[offsets[intro] + node_depth - 1].astype(np.int64)
        # node each plain token ends at (duplicates share it, the empty token is the root)
        last_node = first + count - 1
        src = np.maximum.accumulate(np.where(count > 0, np.arange(m), -1))
        tok_node_sorted = np.where(src >= 0, last_node[np.maximum(src, 0)], 0)

        # ---- atomic nodes: one per distinct atomic byte string
        groups: list[Any] = []  # edge key: the atomic bytes, or the symbol itself
        gstart: list[int] = []
        last: tuple[int, Any] | None = None
        for k, i in enumerate(atom_ids):
            key = atom_key(i)
            if key != last:
                groups.append(entries[i] if key[0] else raw[i])
                gstart.append(m + k)
                last = key
        n_atomic = len(groups)
        self.atomic_keys: list[Any] = groups
        a_first = 1 + n_byte
        a_start = np.array(gstart, dtype=np.int64)
        a_end = np.append(a_start[1:], n).astype(np.int64) if n_atomic else a_start
        atom_group = (
            np.repeat(np.arange(n_atomic), np.diff(np.append(a_start, n)))
            if n_atomic
            else np.zeros(0, np.int64)
        )

        N = 1 + n_byte + n_atomic
        self.n_byte = n_byte
        self.n_atomic = n_atomic
        self.n_internal = N
        self.root = 0
        # The last slot holds the EOS mass; it is a node (``eos_node``, the root's
        # ``EOS`` edge) only when EOS tokens are given, else unreachable (0 / -inf).
        self.eos_slot = N + n
        self.eos_node: int | None = N + n if len(self.eos_ids) else None
        self.num_nodes = N + n + 1

        self.start = np.concatenate([[0], intro, a_start]).astype(np.int64)
        self.end = np.concatenate([[n], node_end, a_end]).astype(np.int64)

        parent = np.empty(self.num_nodes, dtype=np.int64)
        parent[0] = -1
        parent[1 : 1 + n_byte] = parent_b
        parent[a_first:N] = 0
        tok_node = np.empty(n, dtype=np.int64)
        tok_node[perm[:m]] = tok_node_sorted
        tok_node[perm[m:]] = a_first + atom_group
        parent[N : N + n] = tok_node
        parent[self.eos_slot] = 0 if self.eos_node is not None else -1
        self.parent = parent
        self.tok_node = tok_node

        depth = np.zeros(self.num_nodes, dtype=np.int64)
        depth[1 : 1 + n_byte] = node_depth
        depth[a_first:N] = [len(g) if isinstance(g, bytes) else 1 for g in groups]
        depth[N : N + n] = depth[tok_node]
        self.depth = depth
        self._intro_tok = np.concatenate([[-1], perm[intro], perm[a_start]]).astype(np.int64)

        code = np.empty(self.num_nodes, dtype=np.int64)  # edge label into each node
        code[0] = -1
        code[1 : 1 + n_byte] = byte_code
        code[a_first:N] = _CODE_ATOMIC + np.arange(n_atomic)
        code[N : N + n] = _CODE_EOT
        code[self.eos_slot] = _CODE_EOS
        self.edge_code = code

        # CSR of children: leaves first (by token id), then bytes, atomic, EOS
        kids = np.arange(1, self.num_nodes)
        kcode = code[kids]
        order = np.lexsort((kids, np.where(kcode == _CODE_EOT, -1, kcode), parent[kids]))
        kids = kids[order]
        self._kid = kids
        self._kid_ptr = np.searchsorted(parent[kids], np.arange(self.num_nodes + 1))

        self.eos_pos = self.inv_perm[self.eos_ids]
        self.children = ChildrenView(self)
        self.node2prefix = Node2PrefixView(self)
        self.word2leaf = Word2LeafView(self)
        self.leaf2word = LeafView(self, ids=False)
        self.leaf2token_id = LeafView(self, ids=True)

    @property
    def decode(self) -> list[Any]:
        """The vocabulary by position: ``Token`` objects (plain bytes entries get their
        position as id) and symbols as given."""
        if self._tokens is None:
            self._tokens = [
                Token(i, b) if e is None else e for i, (b, e) in enumerate(zip(self._raw, self._entries))
            ]
        return self._tokens

    def _entry(self, i: int) -> Any:
        if self._tokens is not None:
            return self._tokens[i]
        e = self._entries[i]
        return Token(i, self._raw[i]) if e is None else e

    def position_of(self, token_id: int) -> int | None:
        """The position of the entry with ``token_id`` (None if there is none)."""
        tid = int(token_id)
        if self._pos_of_id is None:
            return tid if 0 <= tid < len(self._raw) else None
        return self._pos_of_id.get(tid)

    @property
    def eos_token_ids(self) -> list[int]:
        """Token ids of the EOS entries (``eos_ids`` holds their positions)."""
        return self.token_ids[self.eos_ids].tolist()

    @property
    def raw(self) -> list[bytes]:
        """The vocabulary as plain ``bytes``."""
        return self._raw

    # ------------------------------------------------------------------ queries
    def _make_children(self, node: int) -> NodeChildren:
        a, b = self._kid_ptr[node], self._kid_ptr[node + 1]
        items: list[tuple[Any, int]] = []
        eot = None
        n_int = self.n_internal
        for child in self._kid[a:b].tolist():
            c = int(self.edge_code[child])
            if c < _CODE_EOT:
                items.append((c, child))
            elif c == _CODE_EOT:
                items.append(((EOT, child - n_int), child))
                if eot is None:
                    eot = child
            elif c == _CODE_EOS:
                if self.eos_node is not None:
                    items.append((EOS, child))
            else:
                items.append((self.atomic_keys[c - _CODE_ATOMIC], child))
        return NodeChildren(items, eot)

    def leaves_of(self, node: int) -> list[int]:
        """Every end-of-token leaf below ``node`` via one EOT edge (ascending token
        id; more than one only for duplicate byte strings)."""
        a, b = self._kid_ptr[node], self._kid_ptr[node + 1]
        kids = self._kid[a:b]
        return kids[self.edge_code[kids] == _CODE_EOT].tolist()

    def prefix(self, node: int) -> bytes:
        """The bytes read from the root to ``node`` (a leaf: its token's bytes; the
        EOS node: ``b""``)."""
        if node < 0:
            node += self.num_nodes
        if not 0 <= node < self.num_nodes:
            raise IndexError(node)
        if node == self.root or node == self.eos_slot:
            return b""
        if node >= self.n_internal:
            return self._raw[node - self.n_internal]
        tok = self._raw[int(self._intro_tok[node])]
        return bytes(tok)[: int(self.depth[node])]

    def is_leaf(self, node: int) -> bool:
        """True for end-of-token leaves."""
        return self.n_internal <= node < self.n_internal + len(self._raw)

    @property
    def num_leaves(self) -> int:
        return len(self._raw)
