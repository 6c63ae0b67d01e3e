"""Which KV cells each llama.cpp sequence holds, so a batch is planned before it decodes.

llama.cpp's unified KV cache has ``n_ctx`` cells; a cell holds one token position and
the set of sequences that use it. ``llama_memory_seq_cp(src, dst, 0, n)`` adds ``dst``
to the cells of ``src``'s first ``n`` positions (no new cell); decoding ``k`` tokens of
a sequence takes ``k`` free cells; ``llama_memory_seq_rm`` takes the sequence out of its
cells, and a cell nobody uses is free again. :class:`CellLedger` mirrors exactly that, so
the backend knows before a decode how many cells it needs and how many evicting a
cached sequence frees, and evicts once, enough for the batch, instead of decoding,
failing for want of a slot, evicting one sequence and trying again.

A sequence's positions are ``0..n-1`` and copies take a prefix, so every sequence holds
a prefix of each of a chain of *segments* (the runs of cells one decode created for
one sequence); a segment keeps one use count per cell.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CellLedger"]


class _Segment:
    """Cells one decode created for one sequence: a use count per cell."""

    __slots__ = ("uses",)

    def __init__(self, n: int) -> None:
        self.uses = np.ones(n, dtype=np.int32)


class CellLedger:
    """Cell use of every live sequence of one llama.cpp context."""

    def __init__(self, n_cells: int) -> None:
        self.n_cells = n_cells
        self.used = 0
        self._held: dict[int, list[tuple[_Segment, int]]] = {}

    @property
    def free(self) -> int:
        return self.n_cells - self.used

    def tokens(self, seq: int) -> int:
        """Positions ``seq`` holds."""
        return sum(n for _, n in self._held.get(seq, ()))

    def copy(self, src: int, dst: int, n_tokens: int) -> None:
        """``dst`` (empty) shares the first ``n_tokens`` positions of ``src``."""
        if self._held.get(dst):
            raise ValueError(f"sequence {dst} is not empty")
        held: list[tuple[_Segment, int]] = []
        left = n_tokens
        for seg, n in self._held.get(src, ()):
            if left <= 0:
                break
            k = min(n, left)
            seg.uses[:k] += 1
            held.append((seg, k))
            left -= k
        if left > 0:
            raise ValueError(f"sequence {src} holds fewer than {n_tokens} positions")
        self._held[dst] = held

    def extend(self, seq: int, n_new: int) -> None:
        """``seq`` decoded ``n_new`` more positions: as many new cells."""
        if n_new > 0:
            self._held.setdefault(seq, []).append((_Segment(n_new), n_new))
            self.used += n_new

    def freed_by_removing(self, seq: int) -> int:
        """Cells that removing ``seq`` would free (those no other sequence uses)."""
        return sum(int(np.count_nonzero(seg.uses[:n] == 1)) for seg, n in self._held.get(seq, ()))

    def remove(self, seq: int) -> None:
        for seg, n in self._held.pop(seq, ()):
            self.used -= int(np.count_nonzero(seg.uses[:n] == 1))
            seg.uses[:n] -= 1

    def clear(self) -> None:
        self._held.clear()
        self.used = 0
