"""Node masses read on demand: the lazy result of ``weight_sum(..., lazy=True)``.

Every internal node of a :class:`~genlm_core.trie.structure.TrieStructure` covers a
contiguous range ``[start, end)`` of the vocabulary sorted by bytes, so its mass is
a difference of two prefix sums of the sorted weights. Computing those prefix sums
is one pass over the vocabulary (about 0.2 ms for 151k tokens on one core, see
``benchmarks/``); writing out all ~3 node masses per token afterwards costs more than
that again. A program reads a handful of nodes per step (the children of the nodes
its particles stand on), so :class:`NodeMasses` keeps the prefix sums and answers
``masses[node]`` / ``masses.take(nodes)`` in O(1) per node; ``np.asarray(masses)``
gives the full vector (the same values as ``weight_sum(..., lazy=False)``).

Layout (shared with :mod:`genlm_core.trie._kernels`): the sorted weights are split
into two lanes, positions ``[0, L)`` and ``[L, n)`` with ``L = ceil(n / 2)``; lane
``j`` has its own running sum ``H[j, k]`` (its first ``k`` weights) and, when
``precise``, the running TwoSum residual ``R[j, k]``. A range inside one lane is
``(H[j, e] - H[j, s]) + (R[j, e] - R[j, s])``; a range across the lane boundary
adds lane 0's total to lane 1's prefix with an exact TwoSum. Precision: see
:mod:`genlm_core.trie.cpu`.

A :class:`NodeMasses` keeps a reference to the weights it was computed from (the
leaves are those weights): do not overwrite that buffer while you still read the
result.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["NodeMasses", "NodeMassesBatch", "numpy_prefix_row"]


def numpy_prefix_row(w: np.ndarray, perm: np.ndarray, precise: bool, h: np.ndarray, rr: np.ndarray) -> None:
    """NumPy version of ``_kernels.prefix_row`` (same layout; the residual is
    ``x_k - (S_k - S_{k-1})``, exact or within ``eps * x_k``)."""
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


class NodeMasses:
    """The mass of every node of a trie under one weight vector, computed on access.

    Indexing follows the trie's node numbering: ``m[node]`` (a float),
    ``m[array_of_nodes]`` / ``m.take(nodes)`` (an array), ``m[a:b]``;
    ``np.asarray(m)`` / ``m.numpy()`` materialise all ``num_nodes`` values. The
    dtype is the one the eager ``weight_sum`` returns (float64 for float64 weights,
    float32 otherwise); values are accumulated in float64.
    """

    __slots__ = ("_trie", "_h", "_r", "_precise", "_w", "_eos", "_with_eos", "_L", "dtype", "_full")

    def __init__(
        self,
        trie: Any,
        h: np.ndarray,
        r: np.ndarray | None,
        w: np.ndarray,
        eos: float,
        with_eos: bool,
        dtype: np.dtype,
    ) -> None:
        self._trie = trie
        self._h = h
        self._r = r
        self._precise = r is not None
        self._w = w
        self._eos = float(eos)
        self._with_eos = with_eos
        self._L = h.shape[1] - 1
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
        return self._node(0)

    # ------------------------------------------------------------------ scalar access
    def _prefix(self, p: int) -> tuple[float, float]:
        h, L = self._h, self._L
        if p <= L:
            return float(h[0, p]), (float(self._r[0, p]) if self._precise else 0.0)
        a = float(h[0, L])
        b = float(h[1, p - L])
        s = a + b
        bp = s - a
        err = (a - (s - bp)) + (b - bp)
        if self._precise:
            err = err + float(self._r[0, L]) + float(self._r[1, p - L])
        return s, err

    def _range(self, a: int, b: int) -> float:
        L = self._L
        if b <= L or a >= L:
            j, base = (0, 0) if b <= L else (1, L)
            m = float(self._h[j, b - base]) - float(self._h[j, a - base])
            if self._precise:
                m += float(self._r[j, b - base]) - float(self._r[j, a - base])
            return m
        ha, la = self._prefix(a)
        hb, lb = self._prefix(b)
        return (hb - ha) + (lb - la)

    def _node(self, node: int) -> float:
        t = self._trie
        N = t._N
        if node < N:
            v = self._range(int(t._start[node]), int(t._end[node]))
            if node == 0 and self._with_eos:
                v += self._eos
            return v
        k = node - N
        if k < t._n:
            if self._with_eos and k in t._eos_set:
                return 0.0
            return float(self._w[k])
        return self._eos if self._with_eos else 0.0

    # ------------------------------------------------------------------ vector access
    def take(self, nodes: Any) -> np.ndarray:
        """Masses of ``nodes`` (any integer array-like), in the result dtype."""
        idx = np.asarray(nodes, dtype=np.int64)
        if self._full is not None:
            return self._full.take(idx)
        flat = self._check(idx.ravel())
        t = self._trie
        N, n = t._N, t._n
        out = np.zeros(flat.shape[0], dtype=np.float64)
        internal = flat < N
        if internal.any():
            nodes_i = flat[internal]
            out[internal] = self._ranges(t._start[nodes_i], t._end[nodes_i])
            if self._with_eos:
                out[internal] += np.where(nodes_i == 0, self._eos, 0.0)
        leaf = (flat >= N) & (flat < N + n)
        if leaf.any():
            tok = flat[leaf] - N
            vals = self._w[tok].astype(np.float64)
            if self._with_eos and len(t._eos_ids):
                vals[np.isin(tok, t._eos_ids)] = 0.0
            out[leaf] = vals
        if self._with_eos:
            out[flat == N + n] = self._eos
        return out.astype(self.dtype, copy=False).reshape(idx.shape)

    def _ranges(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        h, L = self._h, self._L
        lane1 = a >= L
        same = (b <= L) | lane1
        j = lane1.astype(np.intp)
        base = np.where(lane1, L, 0)
        m = np.empty(a.shape[0], dtype=np.float64)
        sa, sb = a[same] - base[same], b[same] - base[same]
        js = j[same]
        m[same] = h[js, sb] - h[js, sa]
        if self._precise:
            m[same] += self._r[js, sb] - self._r[js, sa]
        cross = ~same
        if cross.any():
            ha, la = self._prefix_vec(a[cross])
            hb, lb = self._prefix_vec(b[cross])
            m[cross] = (hb - ha) + (lb - la)
        return m

    def _prefix_vec(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h, L = self._h, self._L
        lo_lane = p <= L
        hi = np.empty(p.shape[0])
        lo = np.zeros(p.shape[0])
        q = p[lo_lane]
        hi[lo_lane] = h[0, q]
        if self._precise:
            lo[lo_lane] = self._r[0, q]
        up = ~lo_lane
        if up.any():
            a = h[0, L]
            b = h[1, p[up] - L]
            s = a + b
            bp = s - a
            err = (a - (s - bp)) + (b - bp)
            if self._precise:
                err = err + self._r[0, L] + self._r[1, p[up] - L]
            hi[up] = s
            lo[up] = err
        return hi, lo

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
            return self.dtype.type(self._node(node % nn))
        if isinstance(key, slice):
            return self.take(np.arange(*key.indices(len(self))))
        if isinstance(key, np.ndarray) and key.dtype == np.bool_:
            return self.numpy()[key]
        return self.take(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.numpy())

    def __del__(self) -> None:
        # the prefix-sum buffers go back to the trie's pool (see TokenByteTrie)
        try:
            self._trie._recycle(self._h, self._r)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

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
    """One :class:`NodeMasses` per row of a batch; ``np.asarray`` gives
    ``(batch, num_nodes)``."""

    def __init__(self, rows: list[NodeMasses], trie: Any) -> None:
        self._rows = rows
        self._trie = trie

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple) and len(key) == 2:
            return self._rows[key[0]][key[1]]
        return self._rows[key]

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self._rows), self._trie.num_nodes)

    def numpy(self) -> np.ndarray:
        if not self._rows:
            return np.zeros((0, self._trie.num_nodes), dtype=np.float32)
        return np.stack([r.numpy() for r in self._rows])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"NodeMassesBatch(batch={len(self)}, num_nodes={self._trie.num_nodes})"
