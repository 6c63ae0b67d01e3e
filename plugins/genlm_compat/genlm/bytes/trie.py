"""genlm-bytes' token-byte trie (``genlm.bytes.trie``) on genlm-core's tries.

:class:`TokenByteTrie` holds a genlm-core trie (``.core``: the CPU trie, or the torch
trie on CUDA) and answers as genlm-bytes does: its constructor keywords, its node
numbers (:mod:`genlm.backend.trie.numbering`: the root is the last node, the EOS node
``children[root][257]`` is always there), its structure attributes and float32 torch
results on ``device``.
"""

from __future__ import annotations

import enum
import functools
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from genlm.backend._surface import public_dir  # noqa: E402
from genlm.backend.trie.numbering import ReferenceNumbering, reachability_matrix

from genlm_core.token import Token
from genlm_core.trie.async_trie import AsyncTokenByteTrie as _CoreAsyncTrie
from genlm_core.trie.structure import EOS, TrieMode

__all__ = [
    "EOS",
    "AsyncTokenByteTrie",
    "Token",
    "TokenByteTrie",
    "TrieMode",
    "TrieOp",
]  # + VocabularyEntryError (ours)


class TrieOp(enum.Enum):
    """The operations of a trie request."""

    SUM = "sum"
    MAX = "max"


class VocabularyEntryError(TypeError, AttributeError):
    """A vocabulary entry that is not a ``Token`` (genlm-bytes failed reading its
    ``byte_string``: an ``AttributeError``)."""


def _tokens(decode: Sequence[Any]) -> list[Token]:
    if not decode:
        raise ValueError("decode cannot be empty")
    if Token.is_plain_bytes(decode[0]):
        warnings.warn(
            "Passing plain bytes to TokenByteTrie is deprecated. Use Token objects from decode_vocab() instead.",
            DeprecationWarning,
            stacklevel=3,
        )
        return [Token(i, b) for i, b in enumerate(decode)]
    for i, t in enumerate(decode):
        if not isinstance(t, Token):
            cls = TypeError if i == 0 else VocabularyEntryError
            raise cls(
                f"decode must contain Token objects, got {type(t).__name__} at position {i}. "
                "Use genlm.backend.tokenization.decode_vocab() to get Token objects."
            )
    return list(decode)


class TokenByteTrie:
    """genlm-bytes' ``TokenByteTrie(decode, device=None, atomic_byte_strings=None,
    eot_sentinel=None, eos_byte_strings=None, max_batch_size=64)``.

    ``decode``: ``Token`` objects (plain bytes: their position is the id).
    ``atomic_byte_strings``: tokens with these bytes take one edge from the root.
    ``eos_byte_strings``: tokens with these bytes are EOS tokens
    (``TrieMode.WITH_EOS`` sends their weight to the EOS node and the root only).
    ``eot_sentinel``: the first element of the leaf edge keys ``(eot_sentinel, token_id)``.
    ``max_batch_size``: kept for the signature (genlm-core sizes its own batches).
    """

    def __init__(
        self,
        decode: Sequence[Any],
        device: str | None = None,
        atomic_byte_strings: Iterable[bytes] | None = None,
        eot_sentinel: Any = None,
        eos_byte_strings: Iterable[bytes] | None = None,
        max_batch_size: int = 64,
    ) -> None:
        import torch

        tokens = _tokens(decode)
        self.decode = tokens
        self.max_batch_size = max_batch_size
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"Invalid device: {device}. Must be 'cpu', 'cuda' or None")
        self.eot_sentinel = eot_sentinel
        self.eos_byte_strings = set(eos_byte_strings or [])
        atomic = list(atomic_byte_strings or [])
        present = {bytes(t) for t in tokens}
        for what, strings in (("Atomic", atomic), ("EOS", self.eos_byte_strings)):
            for bs in strings:
                if bs not in present:
                    raise ValueError(f"{what} byte string {bs!r} not in vocabulary")
        self.eos_token_ids = [t.token_id for t in tokens if bytes(t) in self.eos_byte_strings]
        eos = sorted(self.eos_byte_strings)
        if self.device == "cpu":
            from genlm_core.trie.cpu import TokenByteTrie as CoreTrie

            self.core: Any = CoreTrie(tokens, eos_tokens=eos, atomic_tokens=atomic)
        else:
            from genlm_core.trie.torch_impl import TorchTokenByteTrie

            self.core = TorchTokenByteTrie(tokens, eos_tokens=eos, atomic_tokens=atomic, device=self.device)
        ids = [t.token_id for t in tokens]
        self._numbering = ReferenceNumbering(
            self.core.structure, True, lambda p: (eot_sentinel, ids[p]), lambda p: (bytes(tokens[p]), ids[p])
        )
        self.root = self._numbering.root
        self.eos_node = self._numbering.eos_node
        self.children = self._numbering.children
        self.node2prefix = self._numbering.node2prefix

    # ------------------------------------------------------------------ structure
    @functools.cached_property
    def word2leaf(self) -> dict[tuple[bytes, int], int]:
        num = self._numbering
        return {num.word_key(pos): int(leaf) for pos, leaf in enumerate(num.leaves)}

    @functools.cached_property
    def leaf2word(self) -> dict[int, tuple[bytes, int]]:
        return {leaf: word for word, leaf in self.word2leaf.items()}

    @functools.cached_property
    def lookup(self) -> dict[tuple[bytes, int], int]:
        return {word: word[1] for word in self.word2leaf}

    @functools.cached_property
    def token_id_to_leaf(self) -> np.ndarray:
        return self._numbering.leaf_table([t.token_id for t in self.decode])

    @functools.cached_property
    def leaf2token_id(self) -> dict[int, int]:
        return {int(leaf): int(tid) for tid, leaf in self.token_id_to_leaf}

    @functools.cached_property
    def token_ids(self) -> Any:
        import torch

        return torch.tensor(self.token_id_to_leaf[:, 0], dtype=torch.long, device=self.device)

    @property
    def jump(self) -> list[np.ndarray]:
        return self._numbering.jump

    @property
    def ordering(self) -> np.ndarray:
        return self._numbering.ordering

    @functools.cached_property
    def M_no_eos(self) -> Any:
        """Sparse (tokens x nodes) float32: 1 at a token's leaf and every node above it."""
        return reachability_matrix(self._numbering, self.device)

    @property
    def M(self) -> Any:
        return self.M_no_eos

    @functools.cached_property
    def M_with_eos(self) -> Any:
        """As :attr:`M_no_eos` for the other tokens; an EOS token reaches the EOS node and the root only."""
        import torch

        eos = (
            np.isin([bytes(t) for t in self.decode], list(self.eos_byte_strings))
            if self.eos_byte_strings
            else None
        )
        if eos is None or not eos.any():
            return self.M_no_eos
        r, c = self._numbering.reachability(~eos)
        rows = np.flatnonzero(eos)
        r = np.concatenate([r, rows, rows])
        c = np.concatenate([c, np.full(len(rows), self.eos_node), np.full(len(rows), self.root)])
        index = torch.tensor(np.stack([r, c]), dtype=torch.long, device=self.device)
        shape = (len(self.decode), self._numbering.num_nodes)
        return torch.sparse_coo_tensor(
            index, torch.ones(index.shape[1], device=self.device), shape
        ).to_sparse_csr()

    def visualize(self, ws: Any = None) -> Any:
        """The genlm-core trie's graph (genlm-core's node numbers)."""
        return self.core.visualize(ws)

    # ------------------------------------------------------------------ masses
    def _weights(self, ws: Any) -> Any:
        import torch

        if isinstance(ws, (list, tuple)) and ws and hasattr(ws[0], "__len__"):
            return torch.stack([self._weights(w) for w in ws])
        return torch.as_tensor(np.asarray(ws) if isinstance(ws, list) else ws, dtype=torch.float32).cpu()

    def _result(self, masses: Any) -> Any:
        import torch

        return self._numbering.gather(torch.as_tensor(masses).to(self.device))

    def weight_sum(self, ws: Any, mode: Any = None) -> Any:
        """float32 masses of every node (``mode``: ``TrieMode.WITHOUT_EOS``, the default, or ``WITH_EOS``)."""
        return self._result(self.core.weight_sum(self._weights(ws), mode or TrieMode.WITHOUT_EOS))

    def batch_weight_sum(self, ws: Any, mode: Any = None) -> Any:
        return self._result(self.core.batch_weight_sum(self._weights(ws), mode or TrieMode.WITHOUT_EOS))

    def weight_max(self, ws: Any, mode: Any = None) -> Any:
        """float32 max weight below every node."""
        return self._result(self.core.weight_max(self._weights(ws), mode or TrieMode.WITHOUT_EOS))

    def batch_weight_max(self, ws: Any, mode: Any = None) -> Any:
        return self._result(self.core.batch_weight_max(self._weights(ws), mode or TrieMode.WITHOUT_EOS))


class AsyncTokenByteTrie(_CoreAsyncTrie):
    """genlm-core's batching wrapper (concurrent calls become one batch call per
    operation and mode; ``cleanup()`` then more calls works)."""

    @classmethod
    def from_vocab(cls, vocab: Sequence[Any], **kwargs: Any) -> "AsyncTokenByteTrie":  # type: ignore[override]
        """A :class:`TokenByteTrie` of ``vocab`` (``kwargs`` are its keywords), wrapped."""
        return cls(TokenByteTrie(decode=vocab, **kwargs))

    def start(self) -> None:
        """genlm-bytes' ``start()``: genlm-core's wrapper batches with no background task,
        so calls work before and after it and there is nothing to start."""


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
