"""NumPy token-byte trie: node masses as range sums over the sorted vocabulary.

Every internal node covers a contiguous range ``[start, end)`` of the tokens
sorted by bytes (see :mod:`genlm_core.trie.structure`). ``weight_sum`` gathers the
weights into that order, takes one float64 prefix sum ``S`` and reads each node as
``S[end] - S[start]``; leaves are the token weights themselves.

Precision: a bare prefix-sum difference has an absolute error of about
``eps64 * sum(ws)`` (~1e-16 of the total), so masses below ~1e-12 of the total
would lose their relative precision (or even come out negative). We therefore
carry the rounding residual of the prefix sum, ``r_k = x_k - (S_k - S_{k-1})``
(computed exactly or to ``eps * x_k``), and its own prefix sum ``R``; a node is
``(S[end]-S[start]) + (R[end]-R[start])``. The remaining absolute error is about
``eps64**2 * n * sum(ws)`` (~1e-27 for 151k tokens) plus ``eps64`` relative:
masses down to ~1e-20 of the total keep ~1e-7 relative precision, and the root of a
normalised float32 distribution is 1 up to its float32 rounding. ``precise=False``
skips the residual (about 30% faster; absolute error ~1e-16 * total).

``weight_max`` is exact: a segment max (``np.maximum.reduceat`` over the node
ranges) in NumPy, a reverse pass over the pre-order parent array with numba. Empty nodes (the EOS node without EOS tokens, or in ``WITHOUT_EOS``
mode) have sum ``0`` and max ``-inf``, so log-space (negative) weights are handled.

Inputs: numpy arrays or torch tensors (any device; moved to the host), 1-D of
``len(decode)`` or 2-D ``(batch, len(decode))``. Outputs have ``num_nodes``
columns; the dtype is float64 for float64 input and float32 otherwise
(accumulation is always float64). Torch input gives a torch tensor back (CPU).

When numba is installed (``accel="auto"``, the default) the same computations run
as fused one-pass kernels (:mod:`genlm_core.trie._kernels`, compiled once and
cached on disk); ``accel="numpy"`` forces the vectorised NumPy path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from genlm_core.token import Token
from genlm_core.trie.base import BaseTokenByteTrie
from genlm_core.trie.structure import EOSMode, TrieStructure

__all__ = ["TokenByteTrie"]


def _to_numpy(ws: Any) -> tuple[np.ndarray, bool]:
    """(array, came_from_torch)."""
    mod = type(ws).__module__
    if mod.startswith("torch"):
        t = ws.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.numpy(), True
    return np.asarray(ws), False


class TokenByteTrie(BaseTokenByteTrie):
    """Token-byte trie on the CPU (see the module docstring for the layout,
    precision and dtypes).

    Args:
        decode: the byte vocabulary (``bytes`` or ``Token``; position = token id).
        eos_tokens: tokens treated as end-of-sequence (``Token`` = that id, plain
            ``bytes`` = every token with those bytes).
        atomic_tokens: tokens that take a single edge (their whole bytes) from the
            root instead of one edge per byte.
        precise: carry the prefix-sum residual (default; NumPy path only, the numba
            kernel always compensates).
        accel: ``"auto"`` (numba when importable), ``"numba"`` or ``"numpy"``.
    """

    device = "cpu"

    def __init__(
        self,
        decode: Iterable[bytes | Token] | TrieStructure,
        eos_tokens: Iterable[bytes | Token] | None = (),
        atomic_tokens: Iterable[bytes | Token] | None = (),
        *,
        precise: bool = True,
        accel: str = "auto",
        **_ignored: Any,
    ) -> None:
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
        self._k = None
        if accel not in ("auto", "numba", "numpy"):
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
                self._kstart = s.start.astype(i32)
                self._kend = s.end.astype(i32)
                self._keos_pos = s.eos_pos.astype(i32)
                self._keos_ids = s.eos_ids.astype(i32)
                self._ktok_node = s.tok_node.astype(i32)
                self._kparent = s.parent[: s.n_internal].astype(i32)
        self.accel = "numba" if self._k is not None else "numpy"

    # ------------------------------------------------------------------ helpers
    def _prep(self, ws: Any, ndim: int) -> tuple[np.ndarray, bool, np.dtype]:
        arr, from_torch = _to_numpy(ws)
        if arr.ndim != ndim or arr.shape[-1] != self._n:
            want = f"({self._n},)" if ndim == 1 else f"(batch, {self._n})"
            raise ValueError(f"weights must have shape {want}, got {tuple(arr.shape)}")
        if arr.dtype == np.float64:
            out_dtype = np.dtype(np.float64)
        else:
            out_dtype = np.dtype(np.float32)
            if arr.dtype != np.float32:
                arr = arr.astype(np.float32)
        return np.ascontiguousarray(arr), from_torch, out_dtype

    @staticmethod
    def _wrap(out: np.ndarray, from_torch: bool) -> Any:
        if from_torch:
            import torch

            return torch.from_numpy(out)
        return out

    def _run(
        self, arr: np.ndarray, mode: EOSMode, dt: np.dtype, op: str, out: np.ndarray | None = None
    ) -> np.ndarray:
        rows = arr.reshape(-1, self._n)
        shape = arr.shape[:-1] + (self.num_nodes,)
        if out is None:
            out = np.empty((rows.shape[0], self.num_nodes), dtype=dt)
        else:
            if out.shape != shape or out.dtype != dt or not out.flags.c_contiguous:
                raise ValueError(f"out must be a C-contiguous {dt} array of shape {shape}")
            out = out.reshape(rows.shape[0], self.num_nodes)
        with_eos = mode is EOSMode.WITH_EOS and len(self._eos_ids) > 0
        if self._k is not None:
            if op == "sum":
                self._k.sum_rows(
                    rows,
                    self._kperm,
                    self._kstart,
                    self._kend,
                    self._keos_pos,
                    self._keos_ids,
                    with_eos,
                    self._N,
                    out,
                )
            else:
                self._k.max_rows(rows, self._ktok_node, self._kparent, self._keos_ids, with_eos, self._N, out)
        else:
            fn = self._np_sum if op == "sum" else self._np_max
            for r in range(rows.shape[0]):
                fn(rows[r], with_eos, out[r])
        return out.reshape(shape)

    # ------------------------------------------------------------------ numpy path
    def _np_sum(self, w: np.ndarray, with_eos: bool, out: np.ndarray) -> None:
        n, N = self._n, self._N
        x = w.take(self._perm).astype(np.float64, copy=False)
        if with_eos:
            x[self._eos_pos] = 0.0
        S = np.zeros(n + 1)
        np.cumsum(x, out=S[1:])
        mass = S.take(self._end)
        mass -= S.take(self._start)
        if self.precise:
            r = x - np.diff(S)
            R = np.zeros(n + 1)
            np.cumsum(r, out=R[1:])
            corr = R.take(self._end)
            corr -= R.take(self._start)
            mass += corr
        out[N : N + n] = w
        eos = 0.0
        if with_eos:
            eos = float(w.take(self._eos_ids).astype(np.float64).sum())
            mass[0] += eos
            out[N + self._eos_ids] = 0.0
        out[:N] = mass
        out[N + n] = eos

    def _np_max(self, w: np.ndarray, with_eos: bool, out: np.ndarray) -> None:
        n, N = self._n, self._N
        x = np.empty(n + 1)
        x[:n] = w.take(self._perm)
        x[n] = -np.inf
        eos = -np.inf
        if with_eos:
            eos = float(w.take(self._eos_ids).max())
            x[self._eos_pos] = -np.inf
        internal = np.maximum.reduceat(x, self._rs_idx)[0::2]
        internal[0] = max(internal[0], eos)
        out[:N] = internal
        out[N : N + n] = w
        if with_eos:
            out[N + self._eos_ids] = -np.inf
        out[N + n] = eos

    # ------------------------------------------------------------------ public API
    def weight_sum(self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, out: np.ndarray | None = None) -> Any:
        """Mass of every node: the sum of the weights of the tokens below it.

        Args:
            ws: token weights, shape ``(len(decode),)`` (numpy or torch).
            mode: :class:`EOSMode` (default ``WITHOUT_EOS``).
            out: optional preallocated result (C-contiguous, ``(num_nodes,)``, the
                output dtype): reusing one saves the page faults of a fresh array.

        Returns:
            shape ``(num_nodes,)``; a torch tensor if ``ws`` was one.
        """
        arr, ft, dt = self._prep(ws, 1)
        return self._wrap(self._run(arr, self._mode(mode), dt, "sum", out), ft)

    def batch_weight_sum(
        self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, out: np.ndarray | None = None
    ) -> Any:
        """:meth:`weight_sum` of each row of ``ws`` (shape ``(batch, len(decode))``,
        or a list of 1-D weight vectors). Returns ``(batch, num_nodes)``."""
        arr, ft, dt = self._prep(self._stack(ws), 2)
        return self._wrap(self._run(arr, self._mode(mode), dt, "sum", out), ft)

    def weight_max(self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS) -> Any:
        """Max of the weights of the tokens below every node (``-inf`` when none).

        Works for any real weights, e.g. log-probabilities. Shapes as :meth:`weight_sum`.
        """
        arr, ft, dt = self._prep(ws, 1)
        return self._wrap(self._run(arr, self._mode(mode), dt, "max"), ft)

    def batch_weight_max(self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS) -> Any:
        """:meth:`weight_max` of each row; returns ``(batch, num_nodes)``."""
        arr, ft, dt = self._prep(self._stack(ws), 2)
        return self._wrap(self._run(arr, self._mode(mode), dt, "max"), ft)

    @staticmethod
    def _stack(ws: Any) -> Any:
        if isinstance(ws, (list, tuple)):
            if ws and type(ws[0]).__module__.startswith("torch"):
                import torch

                return torch.stack([w.detach().cpu() for w in ws])
            return np.stack([np.asarray(w) for w in ws])
        return ws
