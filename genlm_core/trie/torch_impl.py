"""Torch token-byte trie: the same range-sum layout as the NumPy trie, on any
torch device (CUDA when present).

Inputs are moved to the trie's device once; every step (permuted gather, float64
prefix sums, node gathers) stays there and the result is a tensor on that device:
no host round trip, no ``.item()``. The layout and numbering are those of
:mod:`genlm_core.trie.structure`; the precision argument is the one of
:mod:`genlm_core.trie.cpu` (float64 prefix sum plus the prefix sum of its rounding
residual, ``r_k = x_k - (S_k - S_{k-1})``; this holds for any summation order, so
also for the parallel scan of ``torch.cumsum`` on a GPU). ``weight_max`` uses a
sparse table of range maxima (one ``torch.maximum`` per power of two, each node
answered at its level from two overlapping blocks), exact.

Output dtype: float64 for float64 input, float32 otherwise (float16 / bfloat16 /
integer weights are computed in float32).

Same arguments as the CPU trie (:class:`genlm_core.trie.cpu.TokenByteTrie`):
``weight_sum(ws, mode, *, out=None, lazy=False)``. ``lazy=True`` is accepted and
computes the eager result; :attr:`computes_lazily` is ``False``. Results are
tensors of class :class:`NodeMassTensor`, which also answer the CPU results' calls
(``m[node]``, ``m.take(nodes)`` with any integer array-like, ``np.asarray(m)`` from
any device), so code written for ``make_trie`` runs on either. Weights are checked
as on the CPU (finite for sums, NaN-free for max; see :mod:`genlm_core.trie.base`):
the check reads each row's float64 total and costs one device-to-host sync per call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from genlm_core.token import Token
from genlm_core.trie.base import (
    BaseTokenByteTrie,
    check_bool,
    check_positive_int,
    first_bad_row,
    nonfinite_error,
)
from genlm_core.trie.structure import EOSMode, TrieStructure

__all__ = ["NodeMassTensor", "TorchTokenByteTrie"]


class NodeMassTensor(torch.Tensor):
    """Node masses of the torch trie: a tensor on the trie's device that answers the
    calls of the CPU trie's results (:class:`~genlm_core.trie.node_masses.NodeMasses`
    and NumPy arrays) too.

    * ``m[node]``, ``m[nodes]``, ``m[row]`` of a batch: as a tensor (results of
      indexing are NodeMassTensors again);
    * ``m.take(nodes)``: ``nodes`` may be any integer array-like (a list, a NumPy
      array, a tensor on any device). One distribution: ``(len(nodes),)``; a batch:
      ``(rows, len(nodes))``, the same nodes of every row (as
      ``NodeMassesBatch.take``), unlike ``torch.Tensor.take`` on the flattened batch;
    * ``np.asarray(m)``: a NumPy copy on the host (a CUDA tensor is copied over).

    Any other operation gives a plain ``torch.Tensor``.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __getitem__(self, key: Any) -> Any:
        out = torch.Tensor.__getitem__(self, key)
        return out.as_subclass(NodeMassTensor) if isinstance(out, torch.Tensor) else out

    def take(self, nodes: Any) -> torch.Tensor:  # type: ignore[override]
        if isinstance(nodes, torch.Tensor):
            idx = nodes.to(device=self.device, dtype=torch.long)
        else:
            idx = torch.as_tensor(np.asarray(nodes, dtype=np.int64), device=self.device)
        plain = self.as_subclass(torch.Tensor)
        if plain.ndim <= 1:
            return plain.take(idx)
        return plain[..., idx.reshape(-1)].reshape(*plain.shape[:-1], *idx.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.as_subclass(torch.Tensor).detach().cpu().numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def numpy(self, *, force: bool = False) -> np.ndarray:  # type: ignore[override]
        """A NumPy array on the host (a CUDA tensor is copied over)."""
        return np.asarray(self)


class TorchTokenByteTrie(BaseTokenByteTrie):
    """Token-byte trie computed with torch on ``device``.

    Args:
        decode, eos_tokens, atomic_tokens: as :class:`genlm_core.trie.cpu.TokenByteTrie`.
        device: ``"cuda"``, ``"cpu"``, a ``torch.device``, or ``None``/``"auto"``
            (CUDA when available).
        precise: carry the prefix-sum residual (default True).
        max_batch_size: rows processed at once in the batch methods (bounds the
            float64 temporaries: about ``24 * len(decode)`` bytes per row).

    Unknown options raise a ``ConfigError`` naming them and the accepted ones.
    """

    computes_lazily = False

    def __init__(
        self,
        decode: Iterable[bytes | Token] | TrieStructure,
        eos_tokens: Iterable[bytes | Token] | None = (),
        atomic_tokens: Iterable[bytes | Token] | None = (),
        *,
        device: str | torch.device | None = None,
        precise: bool = True,
        max_batch_size: int = 64,
        **options: Any,
    ) -> None:
        self._reject_unknown(options)
        precise = check_bool("precise", precise)
        max_batch_size = check_positive_int("max_batch_size", max_batch_size)
        if device is None or device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(
                f"device must be a torch device ('cpu', 'cuda', 'cuda:N', ...) or None/'auto', got {device!r}"
            ) from None
        super().__init__(decode, eos_tokens, atomic_tokens)
        self.device = dev
        self.precise = precise
        self.max_batch_size = max_batch_size
        s = self.structure
        self._n = s.num_leaves
        self._N = N = s.n_internal
        dev = self.device

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.long, device=dev)

        self._perm = t(s.perm)
        self._start = t(s.start)
        self._end = t(s.end)
        self._eos_pos = t(s.eos_pos)
        self._eos_ids = t(s.eos_ids)
        self._eos_leaves = t(N + s.eos_ids)
        self._has_eos = len(s.eos_ids) > 0
        # sparse-table levels for weight_max: node i answered at level floor(log2(len))
        length = s.end - s.start
        level = np.floor(np.log2(length)).astype(np.int64)
        self._levels: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for j in range(int(level.max()) + 1):
            nodes = np.flatnonzero(level == j)
            if nodes.size:
                self._levels.append((j, t(nodes), t(s.start[nodes]), t(s.end[nodes] - (1 << j))))

    # ------------------------------------------------------------------ helpers
    def _prep(self, ws: Any, ndim: int, method: str = "") -> torch.Tensor:
        n = self._n
        if isinstance(ws, (list, tuple)):
            if not ws:
                raise ValueError(
                    f"{method or 'batch_weight_sum'} got an empty list: it takes weights of shape "
                    f"(batch, {n}) or a non-empty list of ({n},) vectors; for no rows pass "
                    f"torch.empty((0, {n}))"
                )
            rows = [w if isinstance(w, torch.Tensor) else torch.as_tensor(np.asarray(w)) for w in ws]
            for i, w in enumerate(rows):
                if tuple(w.shape) != (n,):
                    raise ValueError(f"weights row {i} must have shape ({n},), got {tuple(w.shape)}")
            ws = torch.stack([w.to(self.device) for w in rows])
        if not isinstance(ws, torch.Tensor):
            arr = np.ascontiguousarray(ws)
            if arr.dtype.kind not in "fiub":
                raise TypeError(f"weights must be real numbers, got an array of dtype {arr.dtype}")
            ws = torch.from_numpy(arr)
        if ws.is_complex():
            raise TypeError(f"weights must be real numbers, got a tensor of dtype {ws.dtype}")
        if ws.dim() != ndim or ws.shape[-1] != n:
            want = f"({n},)" if ndim == 1 else f"(batch, {n})"
            raise ValueError(f"weights must have shape {want}, got {tuple(ws.shape)}")
        dtype = torch.float64 if ws.dtype == torch.float64 else torch.float32
        return ws.to(device=self.device, dtype=dtype)

    def _sum2d(self, w: torch.Tensor, with_eos: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Masses ``(B, num_nodes)`` and each row's float64 total (for the check)."""
        B, n, N = w.shape[0], self._n, self._N
        out = torch.empty((B, self.num_nodes), dtype=w.dtype, device=self.device)
        out[:, N : N + n] = w
        eos = None
        if with_eos:
            eos = w.index_select(1, self._eos_ids).to(torch.float64).sum(dim=1)
            out[:, self._eos_leaves] = 0.0
            out[:, N + n] = eos.to(w.dtype)
        else:
            out[:, N + n] = 0.0
        if self.device.type == "cpu":
            # one row at a time: 1-D gathers are several times faster on the CPU than
            # ``index_select`` along dim 1 of a 2-D tensor
            total = torch.empty(B, dtype=torch.float64)
            for b in range(B):
                mass, total[b] = self._range_sums(w[b].index_select(0, self._perm), with_eos)
                if eos is not None:
                    mass[0] += eos[b]
                out[b, :N] = mass
        else:
            mass, total = self._range_sums(w.index_select(1, self._perm), with_eos)
            if eos is not None:
                mass[:, 0] += eos
            out[:, :N] = mass
        if eos is not None:
            total = total + eos
        return out, total

    def _range_sums(self, xw: torch.Tensor, with_eos: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Range sums over the last dim of permuted weights ``xw`` (..., n) -> (..., N),
        and the total of the last dim (the last prefix sum)."""
        n = self._n
        x = xw.to(torch.float64)
        if with_eos:
            x[..., self._eos_pos] = 0.0
        S = torch.zeros(x.shape[:-1] + (n + 1,), dtype=torch.float64, device=self.device)
        torch.cumsum(x, dim=-1, out=S[..., 1:])
        d = x.dim() - 1
        mass = S.index_select(d, self._end)
        mass -= S.index_select(d, self._start)
        if self.precise:
            r = x - (S[..., 1:] - S[..., :-1])
            R = torch.zeros_like(S)
            torch.cumsum(r, dim=-1, out=R[..., 1:])
            mass += R.index_select(d, self._end)
            mass -= R.index_select(d, self._start)
        return mass, S[..., n]

    def _max2d(self, w: torch.Tensor, with_eos: bool) -> tuple[torch.Tensor, torch.Tensor]:
        B, n, N = w.shape[0], self._n, self._N
        x = w.t().index_select(0, self._perm)
        if with_eos:
            x[self._eos_pos] = float("-inf")
        res = torch.empty((N, B), dtype=w.dtype, device=self.device)
        tab = x
        cur = 0
        for j, nodes, lo, hi in self._levels:
            while cur < j:
                span = 1 << cur
                tab = torch.maximum(tab[:-span], tab[span:])
                cur += 1
            res[nodes] = torch.maximum(tab.index_select(0, lo), tab.index_select(0, hi))
        out = torch.empty((B, self.num_nodes), dtype=w.dtype, device=self.device)
        out[:, N : N + n] = w
        if with_eos:
            eos = w.index_select(1, self._eos_ids).amax(dim=1)
            res[0] = torch.maximum(res[0], eos)
            out[:, self._eos_leaves] = float("-inf")
            out[:, N + n] = eos
        else:
            out[:, N + n] = float("-inf")
        out[:, :N] = res.t()
        # torch.maximum propagates NaN: the root (every token) shows it
        return out, res[0]

    def _batched(self, w: torch.Tensor, mode: Any, op: str, batched: bool) -> torch.Tensor:
        with_eos = self._mode(mode) is EOSMode.WITH_EOS and self._has_eos
        fn = self._sum2d if op == "sum" else self._max2d
        step = self.max_batch_size
        parts = [fn(w[i : i + step], with_eos) for i in range(0, w.shape[0], step)] or [fn(w, with_eos)]
        out = parts[0][0] if len(parts) == 1 else torch.cat([p[0] for p in parts], dim=0)
        check = parts[0][1] if len(parts) == 1 else torch.cat([p[1] for p in parts], dim=0)
        bad_rows = torch.isnan(check) if op == "max" else ~torch.isfinite(check)
        if bool(bad_rows.any()):  # one device-to-host sync per call
            bad = first_bad_row(bad_rows.cpu().numpy())
            raise nonfinite_error(w[bad], op, bad if batched else None)
        return out

    def _eager(self, ws: Any, mode: Any, op: str, ndim: int, out: Any, method: str) -> torch.Tensor:
        w = self._prep(ws, ndim, method)
        res = self._batched(w if ndim == 2 else w.unsqueeze(0), mode, op, ndim == 2)
        if ndim == 1:
            res = res[0]
        if out is None:
            return res.as_subclass(NodeMassTensor)
        if not isinstance(out, torch.Tensor) or out.shape != res.shape or out.dtype != res.dtype:
            got = f"{out.dtype} of shape {tuple(out.shape)}" if hasattr(out, "shape") else type(out).__name__
            raise ValueError(
                f"out must be a {res.dtype} tensor of shape {tuple(res.shape)} on {self.device}, got {got}"
            )
        out.copy_(res)
        return out

    # ------------------------------------------------------------------ public API
    def weight_sum(
        self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, out: Any = None, lazy: bool = False
    ) -> torch.Tensor:
        """Mass of every node (sum of the weights of the tokens below it), shape
        ``(num_nodes,)``, a tensor on :attr:`device`.

        ``lazy=True`` is accepted for the common trie signature and computes the
        same eager tensor (index it like the lazy CPU result: ``m[node]``);
        ``out`` (a tensor of the result's shape and dtype) receives the result."""
        if check_bool("lazy", lazy) and out is not None:
            raise ValueError("out= cannot be used with lazy=True (nothing is written out)")
        return self._eager(ws, mode, "sum", 1, out, "weight_sum")

    def batch_weight_sum(
        self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, out: Any = None, lazy: bool = False
    ) -> torch.Tensor:
        """:meth:`weight_sum` of each row of ``(batch, len(decode))`` weights (or a
        non-empty list of 1-D vectors); returns ``(batch, num_nodes)`` on
        :attr:`device` (also under ``lazy=True``)."""
        if check_bool("lazy", lazy) and out is not None:
            raise ValueError("out= cannot be used with lazy=True (nothing is written out)")
        return self._eager(ws, mode, "sum", 2, out, "batch_weight_sum")

    def weight_max(self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, out: Any = None) -> torch.Tensor:
        """Max weight of the tokens below every node (``-inf`` when none); correct
        for log-space weights (``-inf``/``inf`` included, NaN raises). Shape
        ``(num_nodes,)`` on :attr:`device`."""
        return self._eager(ws, mode, "max", 1, out, "weight_max")

    def batch_weight_max(self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, out: Any = None) -> torch.Tensor:
        """:meth:`weight_max` of each row; ``(batch, num_nodes)`` on :attr:`device`."""
        return self._eager(ws, mode, "max", 2, out, "batch_weight_max")
