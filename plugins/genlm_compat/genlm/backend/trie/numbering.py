"""genlm-backend's and genlm-bytes' node numbers over genlm-core's trie layout.

Their tries build dict nodes while reading the vocabulary in order, so a node's
children are in the order their first token appears, and then number every node in
post-order. genlm-core's trie (:class:`genlm_core.trie.structure.TrieStructure`) has
the same nodes in another order. :class:`ReferenceNumbering` is the permutation
between the two, computed with array passes (no Python object per node), and the
reference's structure attributes as views over genlm-core's arrays.

The permutation: a child's rank among its siblings is the smallest vocabulary
position below it (a leaf: its token's position); with ``pre`` the pre-order index
under that child order, ``size`` the subtree size and ``d`` the depth in edges, a
node's post-order number is ``pre + size - 1 - d``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from genlm.backend._surface import public_dir  # noqa: E402

from genlm_core.trie.structure import EOS, TrieStructure

__all__ = ["ReferenceNumbering", "reachability_matrix"]


class ReferenceNumbering:
    """Node numbers of the reference trie for genlm-core's ``structure``.

    ``eos_node``: genlm-bytes' layout (an EOS node, key ``257``, the root's last
    child, whether or not EOS tokens are given); else genlm-backend's (no EOS node).
    ``leaf_key(position)`` is the edge key of a token's leaf (``(None, position)`` in
    genlm-backend, ``(eot_sentinel, token_id)`` in genlm-bytes); ``word_key(position)``
    its key in ``word2leaf``.
    """

    def __init__(
        self,
        structure: TrieStructure,
        eos_node: bool,
        leaf_key: Callable[[int], Any],
        word_key: Callable[[int], Any],
    ) -> None:
        s = self.structure = structure
        self.leaf_key, self.word_key = leaf_key, word_key
        n, N = s.num_leaves, s.n_internal
        nodes = np.arange(s.num_nodes)
        keep = nodes != s.eos_slot if not eos_node else np.ones(s.num_nodes, dtype=bool)
        parent = s.parent.copy()
        parent[s.eos_slot] = 0  # genlm-bytes' EOS node hangs on the root
        # first vocabulary position below each node: a range minimum for internal nodes
        first = np.empty(s.num_nodes, dtype=np.int64)
        sentinel = np.append(s.perm, n)
        bounds = np.empty(2 * N, dtype=np.intp)
        bounds[0::2], bounds[1::2] = s.start, s.end
        first[:N] = np.minimum.reduceat(sentinel, bounds)[0::2]
        first[N : N + n] = np.arange(n)
        first[s.eos_slot] = n  # inserted after every token
        depth = np.zeros(s.num_nodes, dtype=np.int64)  # in edges
        depth[1 : 1 + s.n_byte] = s.depth[1 : 1 + s.n_byte]
        depth[1 + s.n_byte : N] = 1
        depth[N : N + n] = depth[s.tok_node] + 1
        depth[s.eos_slot] = 1
        # subtree sizes, deepest nodes first
        size = keep.astype(np.int64)
        kids = nodes[keep & (nodes != 0)]
        levels = [kids[depth[kids] == k] for k in range(int(depth.max()) + 1)]
        for level in reversed(levels[1:]):
            np.add.at(size, parent[level], size[level])
        # pre-order index: parent's + 1 + sizes of the siblings that come first
        order = kids[np.lexsort((first[kids], parent[kids]))]
        csum = np.cumsum(size[order])
        group_start = np.r_[True, parent[order][1:] != parent[order][:-1]]
        base = np.maximum.accumulate(np.where(group_start, np.arange(len(order)), 0))
        offset = np.empty(s.num_nodes, dtype=np.int64)
        offset[order] = csum - size[order] - (csum[base] - size[order][base])
        pre = np.zeros(s.num_nodes, dtype=np.int64)
        for level in levels[1:]:
            pre[level] = pre[parent[level]] + 1 + offset[level]
        ref = np.full(s.num_nodes, -1, dtype=np.int64)
        ref[keep] = (pre + size - 1 - depth)[keep]
        #: reference number of each genlm-core node (-1: not a node there)
        self.ref_of_core = ref
        #: genlm-core node of each reference number: ``core_result[..., core_of_ref]``
        self.core_of_ref = np.empty(int(keep.sum()), dtype=np.int64)
        self.core_of_ref[ref[keep]] = nodes[keep]
        self.num_nodes = len(self.core_of_ref)
        self.root = int(ref[0])
        self.eos_node = int(ref[s.eos_slot]) if eos_node else None
        self._first, self._parent = first, parent
        self._torch_index: dict[str, Any] = {}
        self.leaves = ref[N : N + n]  # reference leaf of each vocabulary position
        self.children = _Children(self)
        self.node2prefix = _Node2Prefix(self)

    # ------------------------------------------------------------------ per node
    def edges(self, node: int) -> dict[Any, int]:
        """``children[node]``: edge key -> child, in the order the reference inserted them."""
        s, c = self.structure, int(self.core_of_ref[node])
        if c == s.eos_slot:
            return {}
        items = []
        for key, child in s.children[c].items():
            if key == EOS:
                continue
            if isinstance(key, tuple):
                key = self.leaf_key(key[1])
            items.append((int(self._first[child]), key, int(self.ref_of_core[child])))
        if c == 0 and self.eos_node is not None:
            items.append((s.num_leaves, EOS, self.eos_node))
        return {key: child for _, key, child in sorted(items, key=lambda t: t[0])}

    def prefix(self, node: int) -> list[Any]:
        """``node2prefix[node]``: the edge labels from the root (bytes as ints; a symbol
        as itself; genlm-bytes' EOS node ``[257]``)."""
        s = self.structure
        c = int(self.core_of_ref[node])
        if c == s.eos_slot:
            return [EOS]
        if s.is_leaf(c):
            c = int(s.parent[c])
        if 1 + s.n_byte <= c < s.n_internal:  # an atomic node: its key is one edge
            key = s.atomic_keys[c - 1 - s.n_byte]
            return list(key) if isinstance(key, bytes) else [key]
        return list(s.prefix(c))

    # ------------------------------------------------------------------ whole-trie arrays
    @functools.cached_property
    def jump(self) -> list[np.ndarray]:
        """Sorted child numbers of every node (int32)."""
        kids = self.core_of_ref[self.core_of_ref != 0]
        parents = self.ref_of_core[self._parent[kids]]
        mine = self.ref_of_core[kids]
        order = np.lexsort((mine, parents))
        split = np.searchsorted(parents[order], np.arange(self.num_nodes + 1))
        flat = mine[order].astype(np.int32)
        return [flat[split[i] : split[i + 1]] for i in range(self.num_nodes)]

    @functools.cached_property
    def ordering(self) -> np.ndarray:
        """Every node but the leaves, children before parents."""
        s = self.structure
        inner = self.ref_of_core[: s.n_internal].tolist()
        if self.eos_node is not None:
            inner.append(self.eos_node)
        return np.sort(np.array(inner, dtype=np.int64))

    def leaf_table(self, ids: Sequence[int]) -> np.ndarray:
        """``[(id, leaf)]`` per vocabulary position (int32): ``idx_to_leaf`` /
        ``token_id_to_leaf``."""
        return np.stack([np.asarray(ids, dtype=np.int64), self.leaves]).T.astype(np.int32)

    def reachability(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(token, node)`` pairs: every token's leaf and its ancestors; ``rows`` (a
        boolean mask) limits them to some tokens."""
        s = self.structure
        n = s.num_leaves
        tok = np.arange(n) if rows is None else np.flatnonzero(rows)
        cur = s.n_internal + tok
        r, c = [], []
        while cur.size:
            r.append(tok)
            c.append(self.ref_of_core[cur])
            live = s.parent[cur] >= 0
            tok, cur = tok[live], s.parent[cur][live]
        return np.concatenate(r), np.concatenate(c)

    def gather(self, result: Any) -> Any:
        """A genlm-core result (``(..., core nodes)``, NumPy or torch on any device) in
        reference numbering."""
        if isinstance(result, np.ndarray):
            return result.take(self.core_of_ref, axis=-1)
        device = str(result.device)
        index = self._torch_index.get(device)
        if index is None:
            import torch

            index = self._torch_index[device] = torch.as_tensor(self.core_of_ref, device=result.device)
        return result.index_select(-1, index)


class _Children(Sequence):
    """``children[node]``: a dict per node, built on first access."""

    def __init__(self, numbering: ReferenceNumbering) -> None:
        self._n = numbering
        self._cache: dict[int, dict[Any, int]] = {}

    def __len__(self) -> int:
        return self._n.num_nodes

    def __getitem__(self, node: Any) -> Any:
        if isinstance(node, slice):
            return [self[i] for i in range(*node.indices(len(self)))]
        node = int(node)
        if node < 0:
            node += len(self)
        if not 0 <= node < len(self):
            raise IndexError("list index out of range")
        d = self._cache.get(node)
        if d is None:
            d = self._cache[node] = self._n.edges(node)
        return d


class _Node2Prefix(Mapping):
    """``node2prefix[node]`` -> list of edge labels (a dict in the reference)."""

    def __init__(self, numbering: ReferenceNumbering) -> None:
        self._n = numbering

    def __len__(self) -> int:
        return self._n.num_nodes

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._n.num_nodes))

    def __getitem__(self, node: Any) -> list[Any]:
        if isinstance(node, bool) or not isinstance(node, (int, np.integer)) or not 0 <= node < len(self):
            raise KeyError(node)
        return self._n.prefix(int(node))


def reachability_matrix(numbering: ReferenceNumbering, device: str, rows: Any = None) -> Any:
    """A float32 CSR matrix (tokens x reference nodes) of ``numbering.reachability``."""
    import torch

    r, c = numbering.reachability(rows)
    n = numbering.structure.num_leaves
    index = torch.tensor(np.stack([r, c]), dtype=torch.long, device=device)
    values = torch.ones(index.shape[1], device=device)
    return torch.sparse_coo_tensor(index, values, (n, numbering.num_nodes)).to_sparse_csr()


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
