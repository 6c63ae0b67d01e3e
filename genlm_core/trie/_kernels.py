"""Numba kernels for :class:`genlm_core.trie.cpu.TokenByteTrie` (optional).

Imported only when numba is installed; :mod:`genlm_core.trie.node_masses` computes
the same values with NumPy. The layout they share (see that module): the weights,
gathered into sorted-vocabulary order, are split into two *lanes* (positions
``[0, L)`` and ``[L, n)``, ``L = ceil(n / 2)``), and each lane gets its own running
float64 prefix sum ``H[lane, k]`` (sum of the lane's first ``k`` weights) and, when
``precise``, the running Neumaier/TwoSum residual ``R[lane, k]``. Two independent
dependency chains keep both floating-point pipes busy (one chain is bound by the
add latency); this is the cost of every mass, so it is the hot loop.

* ``prefix_row``: the lane prefix sums of one row (one pass, gather fused in).
* ``globalize`` + ``nodes_row``: every node's mass from them (eager results).
* ``max_rows``: a reverse pass over the pre-order parent array, exact.
* ``block_rows`` + ``take_nodes`` / ``take_nodes_rows``: the lazy layout of
  :mod:`genlm_core.trie.node_masses` (block sums by a histogram pass over the
  weights in token order, node masses on access).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, boundscheck=False, nogil=True, inline="always")
def _two_sum(s, v):  # pragma: no cover - compiled
    """``s + v`` and its exact rounding error (Knuth's TwoSum)."""
    t = s + v
    b = t - s
    return t, (s - (t - b)) + (v - b)


@njit(cache=True, boundscheck=False, nogil=True, error_model="numpy")
def prefix_row(wr, perm, precise, h, rr):  # pragma: no cover - compiled
    """Lane prefix sums of one row: ``h[j, k]`` (and residuals ``rr[j, k]``)."""
    n = perm.shape[0]
    L = h.shape[1] - 1
    full = n - L  # lane 1 holds positions L..n-1 (full <= L)
    h0 = h[0]
    h1 = h[1]
    h0[0] = 0.0
    h1[0] = 0.0
    s0 = 0.0
    s1 = 0.0
    if precise:
        r0 = rr[0]
        r1 = rr[1]
        r0[0] = 0.0
        r1[0] = 0.0
        c0 = 0.0
        c1 = 0.0
        for k in range(L):
            v0 = np.float64(wr[perm[k]])
            v1 = np.float64(wr[perm[L + k]]) if k < full else 0.0
            s0, e0 = _two_sum(s0, v0)
            s1, e1 = _two_sum(s1, v1)
            c0 += e0
            c1 += e1
            h0[k + 1] = s0
            h1[k + 1] = s1
            r0[k + 1] = c0
            r1[k + 1] = c1
    else:
        for k in range(L):
            s0 += np.float64(wr[perm[k]])
            if k < full:
                s1 += np.float64(wr[perm[L + k]])
            h0[k + 1] = s0
            h1[k + 1] = s1


@njit(cache=True, boundscheck=False, nogil=True, error_model="numpy")
def globalize(h, rr, precise):  # pragma: no cover - compiled
    """Turn lane 1 into global prefix sums in place (lane 0's total added with an
    exact TwoSum, its rounding error kept in the residual). Afterwards the global
    prefix before position ``p`` sits at flat index ``p + (p > L)`` of ``h``."""
    L = h.shape[1] - 1
    a = h[0, L]
    ra = rr[0, L] if precise else 0.0
    for k in range(L + 1):
        s, err = _two_sum(a, h[1, k])
        h[1, k] = s
        if precise:
            rr[1, k] = rr[1, k] + ra + err


@njit(cache=True, boundscheck=False, nogil=True, error_model="numpy")
def nodes_row(hf, rf, precise, gstart, gend, wr, eos_ids, eos, with_eos, n_internal, o):  # pragma: no cover
    """Every node's mass of one row from globalized prefix sums (flat views);
    ``gstart``/``gend`` are the node ranges as flat indices (``p + (p > L)``)."""
    n = wr.shape[0]
    if precise:
        for i in range(n_internal):
            a = gstart[i]
            b = gend[i]
            o[i] = (hf[b] - hf[a]) + (rf[b] - rf[a])
    else:
        for i in range(n_internal):
            o[i] = hf[gend[i]] - hf[gstart[i]]
    for k in range(n):
        o[n_internal + k] = wr[k]
    if with_eos:
        for j in range(eos_ids.shape[0]):
            o[n_internal + eos_ids[j]] = 0.0
        # the root gets the EOS mass in float64: one rounding into ``o``'s dtype
        a = gstart[0]
        b = gend[0]
        root = hf[b] - hf[a]
        if precise:
            root = root + (rf[b] - rf[a])
        o[0] = root + eos
        o[n_internal + n] = eos
    else:
        o[n_internal + n] = 0.0


@njit(cache=True, boundscheck=False, nogil=True)
def max_rows(w, tok_node, parent, eos_ids, with_eos, n_internal, out, nan):  # pragma: no cover
    """Max of every node of each row; ``nan[r]`` is set when row ``r`` holds a NaN
    (the comparisons below would skip it silently)."""
    rows, n = w.shape
    acc = np.empty(n_internal)
    for r in range(rows):
        wr = w[r]
        o = out[r]
        acc[:] = -np.inf
        eos = -np.inf
        seen_nan = False
        if with_eos:
            is_eos = np.zeros(n, dtype=np.bool_)
            for j in range(eos_ids.shape[0]):
                is_eos[eos_ids[j]] = True
        for k in range(n):
            v = np.float64(wr[k])
            if v != v:
                seen_nan = True
            if with_eos and is_eos[k]:
                if v > eos:
                    eos = v
                o[n_internal + k] = -np.inf
                continue
            o[n_internal + k] = wr[k]
            nd = tok_node[k]
            if v > acc[nd]:
                acc[nd] = v
        nan[r] = seen_nan
        for i in range(n_internal - 1, 0, -1):
            p = parent[i]
            if acc[i] > acc[p]:
                acc[p] = acc[i]
        if eos > acc[0]:
            acc[0] = eos
        for i in range(n_internal):
            o[i] = acc[i]
        o[n_internal + n] = eos


@njit(cache=True, boundscheck=False, nogil=True, inline="always")
def _block_prefix(acc, precise, bh, br):  # pragma: no cover - compiled
    nb = bh.shape[0] - 1
    s = 0.0
    c = 0.0
    bh[0] = 0.0
    br[0] = 0.0
    if precise:
        for b in range(nb):
            s, e = _two_sum(s, acc[b])
            c += e
            bh[b + 1] = s
            br[b + 1] = c
    else:
        for b in range(nb):
            s += acc[b]
            bh[b + 1] = s


@njit(cache=True, boundscheck=False, nogil=True, error_model="numpy")
def block_rows(W, blk, precise, acc, bhr, left):  # pragma: no cover - compiled
    """Block sums of each row of ``W`` and their prefix sums.

    ``acc[blk[t]] += W[r, t]`` in token order (sequential reads; the ``nb + 1``
    accumulators stay in L1), so no gather into sorted order is needed; block
    ``nb`` collects what is left out (EOS tokens in ``WITH_EOS`` mode; its sum
    goes to ``left[r]``). Rows go in pairs (two independent histograms per
    pass over ``blk``). Then ``bhr[r, 0, b]`` = sum of blocks ``< b`` and, when
    ``precise``, ``bhr[r, 1, b]`` its running TwoSum residual."""
    rows, n = W.shape
    nb = bhr.shape[2] - 1
    a0 = acc[0]
    a1 = acc[1]
    r = 0
    while r < rows:
        a0[:] = 0.0
        w0 = W[r]
        if r + 1 < rows:
            a1[:] = 0.0
            w1 = W[r + 1]
            for t in range(n):
                b = blk[t]
                a0[b] += np.float64(w0[t])
                a1[b] += np.float64(w1[t])
            _block_prefix(a1, precise, bhr[r + 1, 0], bhr[r + 1, 1])
            left[r + 1] = a1[nb]
        else:
            for t in range(n):
                a0[blk[t]] += np.float64(w0[t])
        _block_prefix(a0, precise, bhr[r, 0], bhr[r, 1])
        left[r] = a0[nb]
        r += 2


@njit(cache=True, boundscheck=False, nogil=True, inline="always")
def _direct(wr, perm, skip, use_skip, a, b):  # pragma: no cover - compiled
    s = 0.0
    if use_skip:
        for k in range(a, b):
            if not skip[k]:
                s += np.float64(wr[perm[k]])
    else:
        for k in range(a, b):
            s += np.float64(wr[perm[k]])
    return s


@njit(cache=True, boundscheck=False, nogil=True, inline="always")
def _take_one(
    nd, start, end, n_internal, B, bh, br, precise, wr, perm, skip, eos_tok, use_skip, eos
):  # pragma: no cover
    """Mass of node ``nd`` (in ``[0, num_nodes)``) of one row: an internal node
    ``[a, e)`` is the full blocks inside it (a prefix-sum difference) plus its
    partial blocks at either end, summed directly (at most ``2 (B - 1)``
    weights); a range inside one or two blocks is summed directly. ``use_skip``:
    ``WITH_EOS`` mode (EOS tokens count only for the root and the EOS node, with
    mass ``eos``)."""
    n = wr.shape[0]
    if nd < n_internal:
        a = start[nd]
        e = end[nd]
        bs = (a + B - 1) // B
        be = e // B
        if bs >= be:
            v = _direct(wr, perm, skip, use_skip, a, e)
        else:
            v = _direct(wr, perm, skip, use_skip, a, bs * B) + _direct(wr, perm, skip, use_skip, be * B, e)
            mid = bh[be] - bh[bs]
            if precise:
                mid += br[be] - br[bs]
            v = mid + v
        if nd == 0:
            v += eos
        return v
    if nd < n_internal + n:
        k = nd - n_internal
        return 0.0 if (use_skip and eos_tok[k]) else np.float64(wr[k])
    return eos


@njit(cache=True, boundscheck=False, nogil=True, error_model="numpy")
def take_nodes(
    nodes, start, end, n_internal, B, bh, br, precise, wr, perm, skip, eos_tok, use_skip, eos, out
):  # pragma: no cover
    """Masses of ``nodes`` (already in ``[0, num_nodes)``) of one lazy row."""
    for i in range(nodes.shape[0]):
        out[i] = _take_one(
            nodes[i], start, end, n_internal, B, bh, br, precise, wr, perm, skip, eos_tok, use_skip, eos
        )


@njit(cache=True, boundscheck=False, nogil=True, error_model="numpy")
def take_nodes_rows(
    nodes, start, end, n_internal, B, bhr, precise, W, perm, skip, eos_tok, use_skip, eos, out
):  # pragma: no cover
    """Masses of the same ``nodes`` in every row of a lazy batch: ``bhr`` is
    ``(rows, 2, nb + 1)``, ``W`` ``(rows, n)``, ``eos`` ``(rows,)``, ``out``
    ``(rows, len(nodes))``."""
    for r in range(W.shape[0]):
        bh = bhr[r, 0]
        br = bhr[r, 1]
        wr = W[r]
        e = eos[r]
        o = out[r]
        for i in range(nodes.shape[0]):
            o[i] = _take_one(
                nodes[i], start, end, n_internal, B, bh, br, precise, wr, perm, skip, eos_tok, use_skip, e
            )
