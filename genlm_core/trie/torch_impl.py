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

Output dtype: float64 for float64 input, float32 otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from genlm_core.token import Token
from genlm_core.trie.base import BaseTokenByteTrie
from genlm_core.trie.structure import EOSMode, TrieStructure

__all__ = ["TorchTokenByteTrie"]


class TorchTokenByteTrie(BaseTokenByteTrie):
    """Token-byte trie computed with torch on ``device``.

    Args:
        decode, eos_tokens, atomic_tokens: as :class:`genlm_core.trie.cpu.TokenByteTrie`.
        device: ``"cuda"``, ``"cpu"``, a ``torch.device``, or ``None``/``"auto"``
            (CUDA when available).
        precise: carry the prefix-sum residual (default True).
        max_batch_size: rows processed at once in the batch methods (bounds the
            float64 temporaries: about ``24 * len(decode)`` bytes per row).
    """

    def __init__(
        self,
        decode: Iterable[bytes | Token] | TrieStructure,
        eos_tokens: Iterable[bytes | Token] | None = (),
        atomic_tokens: Iterable[bytes | Token] | None = (),
        *,
        device: str | torch.device | None = None,
        precise: bool = True,
        max_batch_size: int = 64,
        **_ignored: Any,
    ) -> None:
        super().__init__(decode, eos_tokens, atomic_tokens)
        if device is None or device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.precise = precise
        self.max_batch_size = int(max_batch_size)
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
    def _prep(self, ws: Any, ndim: int) -> torch.Tensor:
        if isinstance(ws, (list, tuple)):
            ws = torch.stack([torch.as_tensor(w) for w in ws])
        if not isinstance(ws, torch.Tensor):
            ws = torch.from_numpy(np.ascontiguousarray(ws))
        if ws.dim() != ndim or ws.shape[-1] != self._n:
            want = f"({self._n},)" if ndim == 1 else f"(batch, {self._n})"
            raise ValueError(f"weights must have shape {want}, got {tuple(ws.shape)}")
        dtype = torch.float64 if ws.dtype == torch.float64 else torch.float32
        return ws.to(device=self.device, dtype=dtype)

    def _sum2d(self, w: torch.Tensor, with_eos: bool) -> torch.Tensor:
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
            for b in range(B):
                mass = self._range_sums(w[b].index_select(0, self._perm), with_eos)
                if eos is not None:
                    mass[0] += eos[b]
                out[b, :N] = mass
        else:
            mass = self._range_sums(w.index_select(1, self._perm), with_eos)
            if eos is not None:
                mass[:, 0] += eos
            out[:, :N] = mass
        return out

    def _range_sums(self, xw: torch.Tensor, with_eos: bool) -> torch.Tensor:
        """Range sums over the last dim of permuted weights ``xw`` (..., n) -> (..., N)."""
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
        return mass

    def _max2d(self, w: torch.Tensor, with_eos: bool) -> torch.Tensor:
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
        return out

    def _batched(self, w: torch.Tensor, mode: Any, op: str) -> torch.Tensor:
        with_eos = self._mode(mode) is EOSMode.WITH_EOS and self._has_eos
        fn = self._sum2d if op == "sum" else self._max2d
        if w.shape[0] <= self.max_batch_size:
            return fn(w, with_eos)
        parts = [
            fn(w[i : i + self.max_batch_size], with_eos) for i in range(0, w.shape[0], self.max_batch_size)
        ]
        return torch.cat(parts, dim=0)

    # ------------------------------------------------------------------ public API
    def weight_sum(self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS) -> torch.Tensor:
        """Mass of every node (sum of the weights of the tokens below it), shape
        ``(num_nodes,)``, a tensor on :attr:`device`."""
        w = self._prep(ws, 1)
        return self._batched(w.unsqueeze(0), mode, "sum")[0]

    def batch_weight_sum(self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS) -> torch.Tensor:
        """:meth:`weight_sum` of each row of ``(batch, len(decode))`` weights (or a
        list of 1-D vectors); returns ``(batch, num_nodes)`` on :attr:`device`."""
        return self._batched(self._prep(ws, 2), mode, "sum")

    def weight_max(self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS) -> torch.Tensor:
        """Max weight of the tokens below every node (``-inf`` when none); correct
        for log-space weights. Shape ``(num_nodes,)`` on :attr:`device`."""
        w = self._prep(ws, 1)
        return self._batched(w.unsqueeze(0), mode, "max")[0]

    def batch_weight_max(self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS) -> torch.Tensor:
        """:meth:`weight_max` of each row; ``(batch, num_nodes)`` on :attr:`device`."""
        return self._batched(self._prep(ws, 2), mode, "max")
