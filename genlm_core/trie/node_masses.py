"""Node masses read on demand: the lazy result of ``weight_sum(..., lazy=True)``.

Every internal node of a :class:`~genlm_core.trie.structure.TrieStructure` covers a
contiguous range ``[start, end)`` of the vocabulary sorted by bytes. Writing out
every node's mass (~3 values per token, 1.9 MB per distribution at 151k tokens)
costs more than reading the weights, and a program reads only a handful of nodes
per step (the children of the nodes its particles stand on). So the lazy result
keeps just *block sums*: the sorted order is cut into blocks of ``B`` positions
(``B = 64``), and one pass over the weights **in token order** adds each weight to
its block (a histogram into ~2.4k accumulators that stay in L1: sequential reads,
no gather, nothing the size of the vocabulary written). Their prefix sums ``BH``
(with the running TwoSum residual ``BR`` when ``precise``) make every node

    mass[a, e) = (BH[be] - BH[bs]) + (BR[be] - BR[bs])      full blocks inside
               + sum of the weights of [a, bs*B) and [be*B, e)  partial blocks

with ``bs = ceil(a / B)``, ``be = floor(e / B)``; a range inside one or two blocks
is summed directly. A read costs at most ``2 (B - 1)`` weights. Precision: the
partial and block sums are plain float64 sums of at most ``2B`` terms (relative
error ~1e-14); the prefix difference has the absolute error of the eager path
(see :mod:`genlm_core.trie.cpu`), so tiny masses keep their relative precision.

A :class:`NodeMasses` keeps a reference to the weights it was computed from (the
leaves and partial blocks are read from them): do not overwrite that buffer while
you still read the result.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "BLOCK",
    "NodeMasses",
    "NodeMassesBatch",
    "numpy_prefix_row",
    "numpy_block_row",
    "numpy_take_nodes",
    "numpy_take_nodes_rows",
]

BLOCK = 64
"""Positions of the sorted vocabulary per block of the lazy layout."""


def numpy_prefix_row(w: np.ndarray, perm: np.ndarray, precise: bool, h: np.ndarray, rr: np.ndarray) -> None:
    """NumPy version of ``_kernels.prefix_row`` (eager path; two lanes, the
    residual is ``x_k - (S_k - S_{k-1})``, exact or within ``eps * x_k``)."""
    L = h.shape[1] - 1
    x = w.take(perm).astype(np.float64, copy=False)
    for j, seg in enumerate((x[:L], x[L:])):
        m = seg.shape[0]
        h[j, 0] = 0.0
        np.cumsum(seg, out=h[j, 1 : m + 1])
        h[j, m + 1 :] = h[j, m]
        if precise:
            rr[j, 0] = 0.0
            np.cumsum(seg - np.diff(h[j, : m + 1]), out=rr[j, 1 : m + 1])
            rr[j, m + 1 :] = rr[j, m]


def numpy_block_row(w: np.ndarray, blk: np.ndarray, precise: bool, bhr: np.ndarray) -> float:
    """NumPy version of ``_kernels.block_row``; ``bhr`` is ``(2, nb + 1)``
    (``BH``, ``BR``). Returns the left-out mass (block ``nb``)."""
    nb = bhr.shape[1] - 1
    acc = np.bincount(blk, weights=w, minlength=nb + 1)
    bh, br = bhr[0], bhr[1]
    bh[0] = 0.0
    np.cumsum(acc[:nb], out=bh[1:])
    br[:] = 0.0
    if precise:
        np.cumsum(acc[:nb] - np.diff(bh), out=br[1:])
    return float(acc[nb])


def numpy_take_nodes(
    nodes: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    n_internal: int,
    B: int,
    bhr: np.ndarray,
    precise: bool,
    w: np.ndarray,
    perm: np.ndarray,
    skip: np.ndarray,
    eos_tok: np.ndarray,
    use_skip: bool,
    eos: float,
) -> np.ndarray:
    """NumPy version of ``_kernels.take_nodes`` (one row; vectorised over ``nodes``)."""
    args = (nodes, start, end, n_internal, B, bhr[None], precise, w[None], perm, skip, eos_tok, use_skip)
    return numpy_take_nodes_rows(*args, np.array([eos], dtype=np.float64))[0]


def numpy_take_nodes_rows(
    nodes: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    n_internal: int,
    B: int,
    bhr: np.ndarray,
    precise: bool,
    W: np.ndarray,
    perm: np.ndarray,
    skip: np.ndarray,
    eos_tok: np.ndarray,
    use_skip: bool,
    eos: np.ndarray,
) -> np.ndarray:
    """NumPy version of ``_kernels.take_nodes_rows``: the same ``nodes`` of every row
    (``bhr`` ``(rows, 2, nb + 1)``, ``W`` ``(rows, n)``, ``eos`` ``(rows,)``);
    returns ``(rows, len(nodes))`` float64, vectorised over rows and nodes."""
    R, n = W.shape
    out = np.empty((R, nodes.shape[0]), dtype=np.float64)
    internal = nodes < n_internal
    if internal.any():
        nd = nodes[internal]
        a, e = start[nd], end[nd]
        bs, be = (a + B - 1) // B, e // B
        full = bs < be
        # [a, left_end) and [right_start, e): the whole range when no full block
        left_end = np.where(full, bs * B, e)
        right_start = np.where(full, be * B, e)
        v = _segment_sums(a, left_end, 2 * B, W, perm, skip, use_skip)
        v += _segment_sums(right_start, e, B, W, perm, skip, use_skip)
        bh, br = bhr[:, 0], bhr[:, 1]
        bsf, bef = np.where(full, bs, 0), np.where(full, be, 0)
        mid = bh[:, bef] - bh[:, bsf]
        if precise:
            mid += br[:, bef] - br[:, bsf]
        v = mid + v
        v[:, nd == 0] += eos[:, None]
        out[:, internal] = v
    leaf = (nodes >= n_internal) & (nodes < n_internal + n)
    if leaf.any():
        tok = nodes[leaf] - n_internal
        vals = W[:, tok].astype(np.float64)
        if use_skip:
            vals[:, eos_tok[tok]] = 0.0
        out[:, leaf] = vals
    out[:, nodes == n_internal + n] = eos[:, None]
    return out


def _segment_sums(
    a: np.ndarray,
    b: np.ndarray,
    width: int,
    W: np.ndarray,
    perm: np.ndarray,
    skip: np.ndarray,
    use_skip: bool,
) -> np.ndarray:
    """``sum(W[r, perm[a_i:b_i]])`` for segments shorter than ``width``: ``(rows, len(a))``."""
    R = W.shape[0]
    if a.shape[0] == 0:
        return np.zeros((R, 0))
    span = int((b - a).max(initial=0))
    if span == 0:
        return np.zeros((R, a.shape[0]))
    width = min(width, span)
    idx = a[:, None] + np.arange(width)
    mask = idx < b[:, None]
    idx = np.where(mask, idx, 0)
    if use_skip:
        mask &= ~skip[idx]
    vals = W[:, perm[idx]].astype(np.float64)
    return np.where(mask, vals, 0.0).sum(axis=-1)


class NodeMasses:
    """The mass of every node of a trie under one weight vector, computed on access.

    Indexing follows the trie's node numbering: ``m[node]`` (a float),
    ``m[array_of_nodes]`` / ``m.take(nodes)`` (an array), ``m[a:b]``. These read
    only the nodes asked for.

    **Materialising**: ``np.asarray(m)``, ``m.numpy()``, ``m.torch()``, iterating,
    a boolean mask index, and anything that converts ``m`` to an array (e.g.
    passing it to a NumPy function) compute *every* node's mass (the eager
    computation, once, then kept): about 10x the cost of the lazy result itself
    on a 151k vocabulary. Read the nodes you need with ``take`` instead.

    The dtype is the one the eager ``weight_sum`` returns (float64 for float64
    weights, float32 otherwise); values are accumulated in float64.
    """

    __slots__ = ("_trie", "_bhr", "_precise", "_w", "_eos", "_with_eos", "dtype", "_full")

    def __init__(
        self,
        trie: Any,
        bhr: np.ndarray,
        precise: bool,
        w: np.ndarray,
        eos: float,
        with_eos: bool,
        dtype: np.dtype,
    ) -> None:
        self._trie = trie
        self._bhr = bhr
        self._precise = precise
        self._w = w
        self._eos = float(eos)
        self._with_eos = with_eos
        self.dtype = np.dtype(dtype)
        self._full: np.ndarray | None = None

    # ------------------------------------------------------------------ shape
    @property
    def shape(self) -> tuple[int]:
        return (self._trie.num_nodes,)

    @property
    def ndim(self) -> int:
        return 1

    def __len__(self) -> int:
        return self._trie.num_nodes

    @property
    def total(self) -> float:
        """The root's mass (every token, EOS included in ``WITH_EOS`` mode)."""
        return float(self._take(np.zeros(1, dtype=np.int64))[0])

    # ------------------------------------------------------------------ access
    def _take(self, flat: np.ndarray) -> np.ndarray:
        """float64 masses of in-range node ids (no checks)."""
        return self._trie._take_nodes(self, flat)

    def take(self, nodes: Any) -> np.ndarray:
        """Masses of ``nodes`` (any integer array-like), in the result dtype."""
        idx = np.asarray(nodes, dtype=np.int64)
        if self._full is not None:
            return self._full.take(idx)
        flat = self._check(idx.ravel())
        return self._take(flat).astype(self.dtype, copy=False).reshape(idx.shape)

    def _check(self, flat: np.ndarray) -> np.ndarray:
        nn = self._trie.num_nodes
        if flat.size and (flat.min() < -nn or flat.max() >= nn):
            bad = flat[(flat < -nn) | (flat >= nn)][0]
            raise IndexError(f"node {int(bad)} is out of range for a trie of {nn} nodes")
        return np.where(flat < 0, flat + nn, flat)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)):
            node = int(key)
            nn = self._trie.num_nodes
            if not -nn <= node < nn:
                raise IndexError(f"node {node} is out of range for a trie of {nn} nodes")
            if self._full is not None:
                return self._full[node]
            return self.dtype.type(self._take(np.array([node % nn], dtype=np.int64))[0])
        if isinstance(key, slice):
            return self.take(np.arange(*key.indices(len(self))))
        if isinstance(key, np.ndarray) and key.dtype == np.bool_:
            return self.numpy()[key]
        return self.take(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.numpy())

    # ------------------------------------------------------------------ materialise
    def numpy(self) -> np.ndarray:
        """All node masses as one array (computed once, then kept)."""
        if self._full is None:
            self._full = self._trie._materialize(self)
        return self._full

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.numpy()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def torch(self) -> Any:
        """All node masses as a CPU torch tensor."""
        import torch

        return torch.from_numpy(self.numpy())

    def __repr__(self) -> str:
        return f"NodeMasses(num_nodes={len(self)}, total={self.total:.6g}, dtype={self.dtype})"


class NodeMassesBatch(Sequence):
    """One :class:`NodeMasses` per row of a batch (``mb[i]``, ``mb[i, node]``).

    ``mb.take(nodes)`` reads the same nodes of every row in one vectorised call:
    a ``(rows, len(nodes))`` array (numba kernel, or NumPy), without building the
    per-row objects. ``np.asarray(mb)`` / ``mb.numpy()`` materialise every node of
    every row, ``(rows, num_nodes)`` (the eager computation; see
    :class:`NodeMasses`).
    """

    def __init__(
        self,
        rows: list[NodeMasses],
        trie: Any,
        bhr: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        eos: np.ndarray | None = None,
        dtype: Any = np.float32,
    ) -> None:
        self._rows = rows
        self._trie = trie
        self._bhr = bhr  # (rows, 2, nb + 1) block prefix sums (and residuals)
        self._w = weights  # (rows, n), the weights the rows keep
        self._eos = eos  # (rows,) EOS mass (WITH_EOS) or zeros
        self.dtype = np.dtype(rows[0].dtype if rows else dtype)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple) and len(key) == 2:
            return self._rows[key[0]][key[1]]
        return self._rows[key]

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self._rows), self._trie.num_nodes)

    def take(self, nodes: Any) -> np.ndarray:
        """Masses of ``nodes`` (any integer array-like, negative ids count from the
        end) in every row: shape ``(rows,) + np.shape(nodes)``, the result dtype."""
        idx = np.asarray(nodes, dtype=np.int64)
        if not self._rows:
            return np.zeros((0,) + idx.shape, dtype=self.dtype)
        flat = self._rows[0]._check(idx.ravel())
        if self._bhr is None:  # rows not from one batch call: read them one by one
            vals = np.stack([r._take(flat) for r in self._rows])
        else:
            vals = self._trie._take_nodes_rows(self, flat)
        return vals.astype(self.dtype, copy=False).reshape((len(self._rows),) + idx.shape)

    def numpy(self) -> np.ndarray:
        """Every node of every row, ``(rows, num_nodes)`` (materialises them all)."""
        if not self._rows:
            return np.zeros((0, self._trie.num_nodes), dtype=self.dtype)
        return np.stack([r.numpy() for r in self._rows])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"NodeMassesBatch(batch={len(self)}, num_nodes={self._trie.num_nodes})"
