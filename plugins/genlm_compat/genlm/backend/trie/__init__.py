"""Token-character tries (genlm-backend's ``genlm.backend.trie``) on genlm-core's tries.

Vocabularies are anything genlm-core's tries take: ``Token`` objects (positions need
not equal ids), bytes, or symbols such as genlm-control's ``EndOfSequence``; weight
vectors are indexed by position. Results are NumPy arrays, as in genlm-backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from genlm_core.trie.async_trie import AsyncTokenByteTrie
from genlm_core.trie.cpu import TokenByteTrie
from genlm_core.trie.torch_impl import TorchTokenByteTrie

__all__ = ["AsyncTokenCharacterTrie", "ParallelTokenCharacterTrie", "TokenCharacterTrie"]


def _mass_sum(self: Any, p_llm: Any) -> np.ndarray:
    """genlm-backend's older name of ``weight_sum``."""
    return self.weight_sum(np.asarray(p_llm, dtype=np.float64))


class TokenCharacterTrie(TokenByteTrie):
    """genlm-core's CPU trie."""

    mass_sum = _mass_sum


class ParallelTokenCharacterTrie(TorchTokenByteTrie):
    """genlm-core's torch trie (CUDA when present) returning NumPy arrays."""

    def __init__(self, decode: Any, device: str | None = None, **kwargs: Any) -> None:
        import torch

        super().__init__(decode, device=device or ("cuda" if torch.cuda.is_available() else "cpu"), **kwargs)

    def batch_weight_sum(self, ws: Any, mode: Any = None) -> np.ndarray:
        return super().batch_weight_sum(ws, mode).cpu().numpy()

    def batch_weight_max(self, ws: Any, mode: Any = None) -> np.ndarray:
        return super().batch_weight_max(ws, mode).cpu().numpy()

    def weight_sum(self, ws: Any, mode: Any = None) -> np.ndarray:
        return self.batch_weight_sum([ws], mode)[0]

    def weight_max(self, ws: Any, mode: Any = None) -> np.ndarray:
        return self.batch_weight_max([ws], mode)[0]

    mass_sum = _mass_sum


class AsyncTokenCharacterTrie(AsyncTokenByteTrie):
    """genlm-core's batching wrapper around any trie (``cleanup()`` then more calls works)."""
