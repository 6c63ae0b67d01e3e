"""CPU token-byte trie: node masses as range sums over the sorted vocabulary.

Kept in one module: it is one class, :class:`TokenByteTrie`. Every method reads the
same private arrays that ``__init__`` derives from the structure (the permutation,
node ranges as lane offsets, block indices and EOS masks of the lazy layout, their
int32 copies for numba) and shares one pool of prefix-sum buffers; each computation
calls its numba kernel or its NumPy twin side by side, so the two paths can be seen to
compute the same thing; and lazy results call back into it for the nodes they read.
What could stand alone already does: the kernels in :mod:`genlm_core.trie._kernels`,
the lazy result types and the NumPy prefix, block and read passes in
:mod:`genlm_core.trie.node_masses`, and how weights come in and results go back (host
arrays from NumPy or torch, dtypes, shapes, ``out=``) in :mod:`genlm_core.trie.cpu_weights`.
Splitting the class (eager sums, lazy sums, max) would spread one set of private
attributes over several files.

Every internal node covers a contiguous range ``[start, end)`` of the tokens
sorted by bytes (see :mod:`genlm_core.trie.structure`). ``weight_sum`` gathers the
weights into that order and takes float64 prefix sums; a node is a difference of
two of them, a leaf is the token's weight. The prefix sums run in two lanes (the
two halves of the sorted order, each its own dependency chain).
``weight_sum(ws, lazy=True)`` instead returns
:class:`~genlm_core.trie.node_masses.NodeMasses`: block sums from one histogram
pass over the weights in token order, node masses computed on access (layout
and bounds in :mod:`genlm_core.trie.node_masses`); the default writes every
node's mass.

Precision: a bare prefix-sum difference has an absolute error of about
``eps64 * sum(ws)`` (~1e-16 of the total), so masses below ~1e-12 of the total
would lose their relative precision (or even come out negative). We therefore
carry the rounding residual of each prefix sum (TwoSum, exact) and its own prefix
sum ``R``; a node is ``(S[end]-S[start]) + (R[end]-R[start])``. The remaining
absolute error is about ``eps64**2 * n * sum(ws)`` (~1e-27 for 151k tokens) plus
``eps64`` relative: masses down to ~1e-20 of the total keep ~1e-7 relative
precision, and the root of a normalised float32 distribution is 1 up to its
float32 rounding. ``precise=False`` skips the residual (about 40% faster lazily);
then the bound is the bare one: absolute error ~1e-16 of the total (at most
``n/2 * eps64 * sum|ws|``), so masses below ~1e-10 of the total are not reliable
(lazily, nodes within a block or two are summed directly and stay exact).

``weight_max`` is exact: a segment max (``np.maximum.reduceat`` over the node
ranges) in NumPy, a reverse pass over the pre-order parent array with numba. Empty nodes (the EOS node without EOS tokens, or in ``WITHOUT_EOS``
mode) have sum ``0`` and max ``-inf``, so log-space (negative) weights are handled.

Inputs: numpy arrays or torch tensors (any device; moved to the host), 1-D of
``len(decode)`` or 2-D ``(batch, len(decode))``. Outputs have ``num_nodes``
columns; the dtype is float64 for float64 input and float32 otherwise
(accumulation is always float64). Torch input gives a torch tensor back (CPU).

When numba is installed (``accel="auto"``, the default) the passes run as
compiled kernels (:mod:`genlm_core.trie._kernels`, compiled once and cached on
disk); ``accel="numpy"`` forces the vectorised NumPy path.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from genlm_core.token import Token
from genlm_core.trie.base import (
    BaseTokenByteTrie,
    check_bool,
    check_device_cpu,
    check_positive_int,
    first_bad_row,
    nonfinite_error,
)
from genlm_core.trie.cpu_weights import check_out, prepare, stack_rows, wrap
from genlm_core.trie.node_masses import (
    BLOCK,
    NodeMasses,
    NodeMassesBatch,
    numpy_block_row,
    numpy_prefix_row,
    numpy_take_nodes,
    numpy_take_nodes_rows,
)
from genlm_core.trie.structure import EOSMode, TrieStructure

__all__ = ["TokenByteTrie"]


class TokenByteTrie(BaseTokenByteTrie):
    """Token-byte trie on the CPU (see the module docstring for the layout,
    precision and dtypes).

    Args:
        decode: the byte vocabulary (``bytes`` or ``Token``; position = token id).
        eos_tokens: tokens treated as end-of-sequence (``Token`` = that id, plain
            ``bytes`` = every token with those bytes).
        atomic_tokens: tokens that take a single edge (their whole bytes) from the
            root instead of one edge per byte.
        precise: carry the prefix-sum residual (default; see the module docstring
            for the bound without it).
        accel: ``"auto"`` (numba when importable), ``"numba"`` or ``"numpy"``.
        buffer_pool_bytes: the eager path's prefix-sum buffers are kept for reuse
            up to this many bytes (default 128 MiB; 0 disables). Fresh memory
            costs page faults and zeroing that are slower than the sums
            themselves (about 2.4 MB per distribution at 151k tokens).
        lazy_block: positions per block of the lazy layout (default 64: the
            block accumulators fit in L1 and a read sums at most 126 weights).
        device: ``None``, ``"auto"`` or ``"cpu"`` (accepted so that every trie
            takes the same arguments; anything else raises).
        max_batch_size: accepted for the common signature (rows are processed
            one at a time here, so there is no batch temporary to bound).

    Unknown options raise a ``ConfigError`` naming them and the accepted ones.
    Weights must be finite for ``weight_sum`` and NaN-free for ``weight_max``
    (:class:`~genlm_core.trie.base.NonFiniteWeightsError` otherwise; see
    :mod:`genlm_core.trie.base`).
    """

    device = "cpu"
    computes_lazily = True

    def __init__(
        self,
        decode: Iterable[bytes | Token] | TrieStructure,
        eos_tokens: Iterable[bytes | Token] | None = (),
        atomic_tokens: Iterable[bytes | Token] | None = (),
        *,
        precise: bool = True,
        accel: str = "auto",
        buffer_pool_bytes: int = 128 << 20,
        lazy_block: int = BLOCK,
        device: str | None = None,
        max_batch_size: int = 64,
        **options: Any,
    ) -> None:
        self._reject_unknown(options)
        check_device_cpu(device, type(self).__name__)
        self.max_batch_size = check_positive_int("max_batch_size", max_batch_size)
        precise = check_bool("precise", precise)
        buffer_pool_bytes = check_positive_int("buffer_pool_bytes", buffer_pool_bytes, 0)
        super().__init__(decode, eos_tokens, atomic_tokens)
        s = self.structure
        self.precise = precise
        self._n = n = s.num_leaves
        self._N = s.n_internal
        self._perm = s.perm
        self._start = s.start
        self._end = s.end
        # interleaved [start_0, end_0, start_1, ...] for reduceat (x gets a sentinel at n)
        self._rs_idx = np.empty(2 * s.n_internal, dtype=np.intp)
        self._rs_idx[0::2] = s.start
        self._rs_idx[1::2] = s.end
        self._eos_pos = s.eos_pos
        self._eos_ids = s.eos_ids
        self._eos_set = frozenset(s.eos_ids.tolist())
        self._L = (n + 1) // 2  # lane length of the prefix sums (node_masses layout)
        self._no_residual = np.zeros((2, 1))  # R placeholder when precise=False
        # node ranges as flat indices into joined lane prefix sums (``p + (p > L)``)
        self._gstart = s.start + (s.start > self._L)
        self._gend = s.end + (s.end > self._L)
        # lazy layout (node_masses): block of every token's sorted position; in
        # WITH_EOS mode EOS tokens go to the spare block ``nb`` instead
        self._B = B = check_positive_int("lazy_block", lazy_block)
        self._nb = nb = -(-n // B)
        bdt = np.uint16 if nb + 1 <= np.iinfo(np.uint16).max else np.int32
        pos = np.empty(n, dtype=np.int64)
        pos[s.perm] = np.arange(n)
        self._blk = (pos // B).astype(bdt)
        self._blk_eos = self._blk.copy()
        self._blk_eos[s.eos_ids] = nb
        self._skip = np.zeros(n, dtype=np.bool_)
        self._skip[s.eos_pos] = True
        self._eos_tok = np.zeros(n, dtype=np.bool_)
        self._eos_tok[s.eos_ids] = True
        self._pool: list[np.ndarray] = []
        self._pool_cap = max(0, int(buffer_pool_bytes)) // (16 * (self._L + 1))
        self._k = None
        if not isinstance(accel, str) or accel not in ("auto", "numba", "numpy"):
            raise ValueError(f"accel must be 'auto', 'numba' or 'numpy', got {accel!r}")
        if accel != "numpy":
            try:
                from genlm_core.trie import _kernels
            except ImportError:
                if accel == "numba":
                    raise ImportError("accel='numba' needs numba: pip install numba") from None
            else:
                self._k = _kernels
                i32 = np.int32 if n < 2**31 - 2 and s.num_nodes < 2**31 else np.int64
                self._kperm = s.perm.astype(i32)
                self._kgstart = self._gstart.astype(i32)
                self._kgend = self._gend.astype(i32)
                self._kstart = s.start.astype(i32)
                self._kend = s.end.astype(i32)
                self._keos_ids = s.eos_ids.astype(i32)
                self._ktok_node = s.tok_node.astype(i32)
                self._kparent = s.parent[: s.n_internal].astype(i32)
        self.accel = "numba" if self._k is not None else "numpy"

    # ------------------------------------------------------------------ helpers
    def _run(
        self, arr: np.ndarray, mode: EOSMode, dt: np.dtype, op: str, out: np.ndarray | None = None
    ) -> np.ndarray:
        rows = arr.reshape(-1, self._n)
        batched = arr.ndim == 2
        shape = arr.shape[:-1] + (self.num_nodes,)
        if out is None:
            out = np.empty((rows.shape[0], self.num_nodes), dtype=dt)
        else:
            check_out(out, shape, dt)
            out = out.reshape(rows.shape[0], self.num_nodes)
        with_eos = mode is EOSMode.WITH_EOS and len(self._eos_ids) > 0
        if op == "sum":
            self._eager_sum(rows, with_eos, out, batched)
            return out.reshape(shape)
        nan = np.zeros(rows.shape[0], dtype=np.bool_)
        if self._k is not None:
            self._k.max_rows(
                rows, self._ktok_node, self._kparent, self._keos_ids, with_eos, self._N, out, nan
            )
        else:
            for r in range(rows.shape[0]):
                nan[r] = self._np_max(rows[r], with_eos, out[r])
        bad = first_bad_row(nan)
        if bad is not None:
            raise nonfinite_error(rows[bad], "max", bad if batched else None)
        return out.reshape(shape)

    # ------------------------------------------------------------------ sums
    def _eager_sum(self, rows: np.ndarray, with_eos: bool, out: np.ndarray, batched: bool = False) -> None:
        # row by row, so the prefix buffers of one row are reused (cache-hot) by the next
        for r in range(rows.shape[0]):
            H, R, eos = self._prefix(rows[r : r + 1], with_eos)
            h = H[0]
            # the total the prefix sums computed anyway: finite iff every weight is
            # (and their sum does not overflow); a non-finite weight would turn
            # unrelated nodes into ``inf - inf``
            if not math.isfinite(float(h[0, -1]) + float(h[1, -1]) + float(eos[0])):
                self._recycle(h, R[0])
                raise nonfinite_error(rows[r], "sum", r if batched else None)
            self._nodes(H, R, rows[r : r + 1], eos, with_eos, out[r : r + 1])

    def _prefix(
        self, rows: np.ndarray, with_eos: bool
    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        """Lane prefix sums ``H[r]`` (and residuals ``R[r]``) of each row, EOS
        tokens left out in ``WITH_EOS`` mode; ``eos`` = each row's EOS mass.

        One array per row (not one block for the batch): a freed per-row array is
        reused by the allocator on the next call, while a batch-sized block is a
        fresh mapping whose page faults cost more than the sums themselves."""
        B = rows.shape[0]
        src = rows
        eos = np.zeros(B)
        if with_eos:
            eos = rows[:, self._eos_ids].astype(np.float64).sum(axis=1)
            src = rows.copy()
            src[:, self._eos_ids] = 0
        H = [self._buffer() for _ in range(B)]
        R = [self._buffer() if self.precise else self._no_residual for _ in range(B)]
        for r in range(B):
            if self._k is not None:
                self._k.prefix_row(src[r], self._kperm, self.precise, H[r], R[r])
            else:
                with np.errstate(invalid="ignore", over="ignore"):  # non-finite: raised by the caller
                    numpy_prefix_row(src[r], self._perm, self.precise, H[r], R[r])
        return H, R, eos

    def _nodes(
        self,
        H: list[np.ndarray],
        R: list[np.ndarray],
        rows: np.ndarray,
        eos: np.ndarray,
        with_eos: bool,
        out: np.ndarray,
    ) -> None:
        """Every node's mass from the lane prefix sums (into ``out``; ``H``/``R``
        are consumed)."""
        if self._k is not None:
            k = self._k
            for r in range(rows.shape[0]):
                k.globalize(H[r], R[r], self.precise)
                k.nodes_row(
                    H[r].reshape(-1),
                    R[r].reshape(-1),
                    self.precise,
                    self._kgstart,
                    self._kgend,
                    rows[r],
                    self._keos_ids,
                    float(eos[r]),
                    with_eos,
                    self._N,
                    out[r],
                )
                self._recycle(H[r], R[r])
            return
        N, n = self._N, self._n
        for r in range(rows.shape[0]):
            h, rr = H[r], R[r]
            a = h[0, -1]  # join the lanes as the kernel's ``globalize`` does
            b = h[1].copy()
            h[1] += a
            bp = h[1] - a
            err = (a - (h[1] - bp)) + (b - bp)
            hf = h.reshape(-1)
            m = hf[self._gend] - hf[self._gstart]
            if self.precise:
                rr[1] += rr[0, -1] + err
                rf = rr.reshape(-1)
                m += rf[self._gend] - rf[self._gstart]
            o = out[r]
            o[:N] = m
            o[N : N + n] = rows[r]
            if with_eos:
                o[N + self._eos_ids] = 0.0
                o[0] = m[0] + eos[r]  # in float64: one rounding into ``o``'s dtype
            o[N + n] = eos[r] if with_eos else 0.0
            self._recycle(h, rr)

    def _buffer(self) -> np.ndarray:
        """A ``(2, L + 1)`` float64 buffer, recycled when one is free."""
        try:
            return self._pool.pop()
        except IndexError:
            return np.empty((2, self._L + 1))

    def _recycle(self, *bufs: np.ndarray | None) -> None:
        """Give buffers back to the pool (each exactly once: callers own them)."""
        for b in bufs:
            if b is not None and b is not self._no_residual and len(self._pool) < self._pool_cap:
                self._pool.append(b)

    def _lazy(self, arr: np.ndarray, mode: EOSMode, dt: np.dtype) -> NodeMasses | NodeMassesBatch:
        """Block sums of each row (the lazy layout of :mod:`node_masses`): one
        :class:`NodeMasses` for 1-D weights, a :class:`NodeMassesBatch` for 2-D."""
        rows = arr.reshape(-1, self._n)
        with_eos = mode is EOSMode.WITH_EOS and len(self._eos_ids) > 0
        blk = self._blk_eos if with_eos else self._blk
        nb = self._nb
        bhr = np.empty((rows.shape[0], 2, nb + 1))
        left = np.zeros(rows.shape[0])
        if self._k is not None:
            self._k.block_rows(rows, blk, self.precise, np.empty((2, nb + 1)), bhr, left)
        else:
            with np.errstate(invalid="ignore", over="ignore"):  # non-finite weights: raised below
                for i in range(rows.shape[0]):
                    left[i] = numpy_block_row(rows[i], blk, self.precise, bhr[i])
        # each row's total (all blocks + the left-out EOS mass): finite iff every
        # weight is, as in the eager path
        if rows.shape[0] == 1:
            if not math.isfinite(float(bhr[0, 0, nb]) + float(left[0])):
                raise nonfinite_error(rows[0], "sum", 0 if arr.ndim == 2 else None)
            if arr.ndim == 1:
                return NodeMasses(
                    self, bhr[0], self.precise, rows[0], left[0] if with_eos else 0.0, with_eos, dt
                )
        for r, (tot, eos_mass) in enumerate(zip(bhr[:, 0, nb].tolist(), left.tolist())):
            if not math.isfinite(tot + eos_mass):
                raise nonfinite_error(rows[r], "sum", r)
        eos = left if with_eos else np.zeros(rows.shape[0])
        masses = [
            NodeMasses(self, bhr[i], self.precise, rows[i], eos[i], with_eos, dt)
            for i in range(rows.shape[0])
        ]
        return NodeMassesBatch(masses, self, bhr, rows, eos, dt)

    def _take_nodes(self, nm: NodeMasses, nodes: np.ndarray) -> np.ndarray:
        """float64 masses of in-range ``nodes`` of a lazy result."""
        if self._k is not None:
            out = np.empty(nodes.shape[0])
            self._k.take_nodes(
                nodes,
                self._kstart,
                self._kend,
                self._N,
                self._B,
                nm._bhr[0],
                nm._bhr[1],
                nm._precise,
                nm._w,
                self._kperm,
                self._skip,
                self._eos_tok,
                nm._with_eos,
                nm._eos,
                out,
            )
            return out
        return numpy_take_nodes(
            nodes,
            self._start,
            self._end,
            self._N,
            self._B,
            nm._bhr,
            nm._precise,
            nm._w,
            self._perm,
            self._skip,
            self._eos_tok,
            nm._with_eos,
            nm._eos,
        )

    def _take_nodes_rows(self, mb: NodeMassesBatch, nodes: np.ndarray) -> np.ndarray:
        """float64 masses ``(rows, len(nodes))`` of in-range ``nodes`` of every row
        of a lazy batch (one call)."""
        with_eos = bool(mb._rows[0]._with_eos)
        if self._k is not None:
            out = np.empty((len(mb), nodes.shape[0]))
            self._k.take_nodes_rows(
                nodes,
                self._kstart,
                self._kend,
                self._N,
                self._B,
                mb._bhr,
                self.precise,
                mb._w,
                self._kperm,
                self._skip,
                self._eos_tok,
                with_eos,
                mb._eos,
                out,
            )
            return out
        return numpy_take_nodes_rows(
            nodes,
            self._start,
            self._end,
            self._N,
            self._B,
            mb._bhr,
            self.precise,
            mb._w,
            self._perm,
            self._skip,
            self._eos_tok,
            with_eos,
            mb._eos,
        )

    def _materialize(self, nm: NodeMasses) -> np.ndarray:
        """All node masses of a lazy result (called by :meth:`NodeMasses.numpy`):
        the eager computation on the weights it keeps."""
        out = np.empty((1, self.num_nodes), dtype=nm.dtype)
        self._eager_sum(nm._w[None], nm._with_eos, out)
        return out[0]

    # ------------------------------------------------------------------ numpy max
    def _np_max(self, w: np.ndarray, with_eos: bool, out: np.ndarray) -> bool:
        """Max of every node of one row into ``out``; True when ``w`` holds a NaN."""
        n, N = self._n, self._N
        x = np.empty(n + 1)
        x[:n] = w.take(self._perm)
        x[n] = -np.inf
        eos = -np.inf
        if with_eos:
            eos = float(w.take(self._eos_ids).max())
            x[self._eos_pos] = -np.inf
        internal = np.maximum.reduceat(x, self._rs_idx)[0::2]
        # np.maximum propagates NaN: the root (every non-EOS token) and ``eos`` show it
        nan = bool(np.isnan(internal[0]) or np.isnan(eos))
        internal[0] = max(internal[0], eos)
        out[:N] = internal
        out[N : N + n] = w
        if with_eos:
            out[N + self._eos_ids] = -np.inf
        out[N + n] = eos
        return nan

    # ------------------------------------------------------------------ public API
    def weight_sum(
        self,
        ws: Any,
        mode: Any = EOSMode.WITHOUT_EOS,
        *,
        out: np.ndarray | None = None,
        lazy: bool = False,
    ) -> Any:
        """Mass of every node: the sum of the weights of the tokens below it.

        Args:
            ws: token weights, shape ``(len(decode),)`` (numpy or torch, any real
                dtype); finite (NaN or inf raises
                :class:`~genlm_core.trie.base.NonFiniteWeightsError`).
            mode: :class:`EOSMode` (default ``WITHOUT_EOS``).
            out: optional preallocated result (C-contiguous, ``(num_nodes,)``, the
                output dtype): reusing one saves the page faults of a fresh array.
            lazy: return a :class:`~genlm_core.trie.node_masses.NodeMasses` that
                computes node masses when they are read (``m[node]``,
                ``m.take(nodes)``) instead of writing out all ``num_nodes``
                values: one histogram pass over the weights (no
                vocabulary-sized output; see :mod:`~genlm_core.trie.node_masses`).
                ``np.asarray(m)`` (or anything converting ``m`` to an array)
                silently computes every node's mass, the eager cost: read the
                nodes you need with ``m.take(nodes)``. It keeps a reference to
                ``ws``.

        Returns:
            shape ``(num_nodes,)``; a torch tensor if ``ws`` was one (eager only).
        """
        return self._sum(ws, 1, mode, out, lazy)

    def batch_weight_sum(
        self,
        ws: Any,
        mode: Any = EOSMode.WITHOUT_EOS,
        *,
        out: np.ndarray | None = None,
        lazy: bool = False,
    ) -> Any:
        """:meth:`weight_sum` of each row of ``ws`` (shape ``(batch, len(decode))``,
        or a non-empty list of 1-D weight vectors). Returns ``(batch, num_nodes)``,
        or with ``lazy=True`` a :class:`~genlm_core.trie.node_masses.NodeMassesBatch`
        (one lazy row per distribution; ``mb.take(nodes)`` reads the same nodes
        of every row in one call, ``(batch, len(nodes))``)."""
        return self._sum(stack_rows(ws, self._n, "batch_weight_sum"), 2, mode, out, lazy)

    def _sum(self, ws: Any, ndim: int, mode: Any, out: np.ndarray | None, lazy: bool) -> Any:
        lazy = check_bool("lazy", lazy)
        arr, ft, dt = prepare(ws, self._n, ndim)
        m = self._mode(mode)
        if not lazy:
            return wrap(self._run(arr, m, dt, "sum", out), ft)
        if out is not None:
            raise ValueError("out= cannot be used with lazy=True (nothing is written out)")
        return self._lazy(arr, m, dt)

    def weight_max(self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, out: np.ndarray | None = None) -> Any:
        """Max of the weights of the tokens below every node (``-inf`` when none).

        Works for any real weights, e.g. log-probabilities (``-inf`` and ``inf``
        included; NaN raises :class:`~genlm_core.trie.base.NonFiniteWeightsError`).
        Shapes and ``out`` as :meth:`weight_sum`.
        """
        arr, ft, dt = prepare(ws, self._n, 1)
        return wrap(self._run(arr, self._mode(mode), dt, "max", out), ft)

    def batch_weight_max(
        self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, out: np.ndarray | None = None
    ) -> Any:
        """:meth:`weight_max` of each row; returns ``(batch, num_nodes)``."""
        arr, ft, dt = prepare(stack_rows(ws, self._n, "batch_weight_max"), self._n, 2)
        return wrap(self._run(arr, self._mode(mode), dt, "max", out), ft)
