"""Fused numba kernels for :class:`genlm_core.trie.cpu.TokenByteTrie` (optional).

Imported only when numba is installed; the NumPy code path computes the same
values. One pass each, no temporaries beyond two prefix arrays:

* ``sum_rows``: permuted gather + Neumaier-compensated float64 prefix sum (high
  part ``hi`` and the running compensation ``lo``), then each internal node
  ``(hi[end]-hi[start]) + (lo[end]-lo[start])``, then the leaves (a copy of the
  weights).
* ``max_rows``: a reverse pass over the pre-order parent array (children have
  larger ids than their parents), exact.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, boundscheck=False, nogil=True)
def sum_rows(w, perm, start, end, eos_pos, eos_ids, with_eos, n_internal, out):  # pragma: no cover
    rows, n = w.shape
    hi = np.empty(n + 1)
    lo = np.empty(n + 1)
    for r in range(rows):
        wr = w[r]
        o = out[r]
        # leaves first: this sequential pass also brings the row into cache before
        # the permuted gather below reads it in random order
        for k in range(n):
            o[n_internal + k] = wr[k]
        hi[0] = 0.0
        lo[0] = 0.0
        s = 0.0
        c = 0.0
        if with_eos:
            skip = np.zeros(n, dtype=np.bool_)
            for k in range(eos_pos.shape[0]):
                skip[eos_pos[k]] = True
        for k in range(n):
            v = np.float64(wr[perm[k]])
            if with_eos and skip[k]:
                v = 0.0
            t = s + v
            if abs(s) >= abs(v):
                c += (s - t) + v
            else:
                c += (v - t) + s
            s = t
            hi[k + 1] = s
            lo[k + 1] = c
        for i in range(start.shape[0]):
            a = start[i]
            b = end[i]
            o[i] = (hi[b] - hi[a]) + (lo[b] - lo[a])
        eos = 0.0
        if with_eos:
            for j in range(eos_ids.shape[0]):
                eos += np.float64(wr[eos_ids[j]])
                o[n_internal + eos_ids[j]] = 0.0
            o[0] = (hi[n] + lo[n]) + eos
        o[n_internal + n] = eos


@njit(cache=True, boundscheck=False, nogil=True)
def max_rows(w, tok_node, parent, eos_ids, with_eos, n_internal, out):  # pragma: no cover
    rows, n = w.shape
    acc = np.empty(n_internal)
    for r in range(rows):
        wr = w[r]
        o = out[r]
        acc[:] = -np.inf
        eos = -np.inf
        if with_eos:
            is_eos = np.zeros(n, dtype=np.bool_)
            for j in range(eos_ids.shape[0]):
                is_eos[eos_ids[j]] = True
        for k in range(n):
            v = np.float64(wr[k])
            if with_eos and is_eos[k]:
                if v > eos:
                    eos = v
                o[n_internal + k] = -np.inf
                continue
            o[n_internal + k] = wr[k]
            nd = tok_node[k]
            if v > acc[nd]:
                acc[nd] = v
        for i in range(n_internal - 1, 0, -1):
            p = parent[i]
            if acc[i] > acc[p]:
                acc[p] = acc[i]
        if eos > acc[0]:
            acc[0] = eos
        for i in range(n_internal):
            o[i] = acc[i]
        o[n_internal + n] = eos
