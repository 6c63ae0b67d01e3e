"""Token-character tries (genlm-backend's ``genlm.backend.trie``) on genlm-core's tries.

Each class holds a genlm-core trie (``.core``) and answers in genlm-backend's terms:
its node numbers (:mod:`genlm.backend.trie.numbering`: the root is the last node, no
EOS node), structure attributes (``children``, ``node2prefix``, ``word2leaf``,
``leaf2word``, ``jump``, ``ordering``, ``idx_to_leaf``) and result types
(``TokenCharacterTrie``: float64 NumPy arrays; ``ParallelTokenCharacterTrie``: float32).
Vocabularies are ``Token`` objects (positions need not equal ids), bytes, or symbols
such as genlm-control's ``EndOfSequence``; weight vectors are indexed by position.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from genlm.backend._surface import public_dir  # noqa: E402
from genlm.backend.trie.numbering import ReferenceNumbering, reachability_matrix

from genlm_core.token import Token
from genlm_core.trie.async_trie import AsyncTokenByteTrie
from genlm_core.trie.cpu import TokenByteTrie

__all__ = ["AsyncTokenCharacterTrie", "ParallelTokenCharacterTrie", "TokenCharacterTrie"]


def _word_key(item: Any) -> Any:
    if isinstance(item, Token):
        return (bytes(item), item.token_id)
    return item


class TokenCharacterTrie:
    """genlm-backend's ``TokenCharacterTrie(decode)`` on genlm-core's CPU trie."""

    def __init__(self, decode: Sequence[Any]) -> None:
        self.decode = decode
        plain = [bytes(t) for t in decode if Token.is_plain_bytes(t)]
        if plain:
            warnings.warn(
                "Passing plain bytes to TokenCharacterTrie is deprecated. Use Token objects from decode_vocab() instead.",
                DeprecationWarning,
                stacklevel=2,
            )
            if len(set(plain)) < len(plain):
                dup = next(b for b in plain if plain.count(b) > 1)
                raise ValueError(f"Duplicate word in vocabulary: {dup!r}")
        self.core = self._build(decode)
        self._numbering = ReferenceNumbering(
            self.core.structure, False, lambda pos: (None, pos), lambda pos: _word_key(decode[pos])
        )
        self.root = self._numbering.root
        self.children = self._numbering.children
        self.node2prefix = self._numbering.node2prefix

    def _build(self, decode: Sequence[Any]) -> Any:
        return TokenByteTrie(decode)

    # ------------------------------------------------------------------ structure
    @functools.cached_property
    def word2leaf(self) -> dict[Any, int]:
        num = self._numbering
        return {num.word_key(pos): int(leaf) for pos, leaf in enumerate(num.leaves)}

    @functools.cached_property
    def leaf2word(self) -> dict[int, Any]:
        return {leaf: word for word, leaf in self.word2leaf.items()}

    @property
    def jump(self) -> list[np.ndarray]:
        return self._numbering.jump

    @property
    def ordering(self) -> np.ndarray:
        return self._numbering.ordering

    @functools.cached_property
    def idx_to_leaf(self) -> np.ndarray:
        return self._numbering.leaf_table(range(len(self.decode)))

    def visualize(self, ws: Any = None) -> Any:
        """The genlm-core trie's graph (genlm-core's node numbers)."""
        return self.core.visualize(ws)

    # ------------------------------------------------------------------ masses
    def _weights(self, ws: Any) -> Any:
        if type(ws).__module__.startswith("torch"):
            ws = ws.detach().cpu().numpy()
        return np.asarray(ws, dtype=np.float64)

    def _result(self, masses: Any) -> np.ndarray:
        return self._numbering.gather(masses)

    def weight_sum(self, ws: Any, mode: Any = None) -> np.ndarray:
        """The summed weight of the tokens below every node (``ws[i]`` is ``decode[i]``'s)."""
        return self._result(self.core.weight_sum(self._weights(ws), mode))

    def weight_max(self, ws: Any, mode: Any = None) -> np.ndarray:
        """The largest weight of the tokens below every node (any real weights)."""
        return self._result(self.core.weight_max(self._weights(ws), mode))

    def batch_weight_sum(self, ws: Any, mode: Any = None) -> np.ndarray:
        return self._result(self.core.batch_weight_sum(self._stack(ws), mode))

    def batch_weight_max(self, ws: Any, mode: Any = None) -> np.ndarray:
        return self._result(self.core.batch_weight_max(self._stack(ws), mode))

    def _stack(self, ws: Any) -> Any:
        if isinstance(ws, (list, tuple)):
            return [self._weights(w) for w in ws]
        return self._weights(ws)

    def mass_sum(self, p_llm: Any) -> np.ndarray:
        """:meth:`weight_sum` under its name in genlm-backend's older releases."""
        return self.weight_sum(p_llm)


class ParallelTokenCharacterTrie(TokenCharacterTrie):
    """genlm-backend's ``ParallelTokenCharacterTrie(decode, device=None)`` on genlm-core's
    torch trie (CUDA when present): float32 results as NumPy arrays."""

    def __init__(self, decode: Sequence[Any], device: str | None = None) -> None:
        import torch

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"Invalid device: {device}. Must be 'cpu', 'cuda' or None")
        super().__init__(decode)

    def _build(self, decode: Sequence[Any]) -> Any:
        from genlm_core.trie.torch_impl import TorchTokenByteTrie

        return TorchTokenByteTrie(decode, device=self.device)

    @functools.cached_property
    def M(self) -> Any:
        """The sparse (tokens x nodes) matrix: 1 where a node is a token's leaf or above it."""
        return reachability_matrix(self._numbering, self.device)

    @functools.cached_property
    def positions(self) -> Any:
        import torch

        return torch.tensor(self.idx_to_leaf[:, 0], dtype=torch.long, device=self.device)

    def _weights(self, ws: Any) -> Any:
        import torch

        return torch.as_tensor(ws, dtype=torch.float32, device=self.device)

    def _result(self, masses: Any) -> np.ndarray:
        return super()._result(masses).float().cpu().numpy()


class AsyncTokenCharacterTrie(AsyncTokenByteTrie):
    """genlm-core's batching wrapper around any trie (``cleanup()`` then more calls works)."""

    @classmethod
    def from_vocab(
        cls, vocab: Sequence[Any], backend: str = "parallel", **kwargs: Any
    ) -> "AsyncTokenCharacterTrie":  # type: ignore[override]
        """``backend="parallel"`` (:class:`ParallelTokenCharacterTrie`) or ``"sequential"``
        (:class:`TokenCharacterTrie`); ``kwargs`` go to the trie."""
        if backend == "sequential":
            return cls(TokenCharacterTrie(vocab, **kwargs))
        if backend == "parallel":
            return cls(ParallelTokenCharacterTrie(vocab, **kwargs))
        raise ValueError(f"Unknown backend: {backend}. Must be one of ['sequential', 'parallel']")

    def start(self) -> None:
        """genlm-backend's ``start()``: nothing to start (no background task here)."""


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
