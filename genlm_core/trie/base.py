"""Common surface of the trie implementations (structure access, visualisation)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from genlm_core.token import Token
from genlm_core.trie.structure import EOS, EOT, EOSMode, TrieStructure, coerce_mode

__all__ = ["BaseTokenByteTrie"]


class BaseTokenByteTrie:
    """Structure attributes shared by every implementation.

    Attributes mirror genlm-bytes' ``TokenByteTrie``: ``root``, ``children``
    (``children[node]`` is a dict: byte ``int`` / ``(None, token_id)`` end-of-token
    edge / atomic ``bytes`` / ``EOS`` -> child node; ``.get(None)`` gives the
    lowest-id end-of-token leaf), ``node2prefix`` (node -> ``bytes``), ``word2leaf``,
    ``leaf2word``, ``leaf2token_id``, ``decode`` (the vocabulary as ``Token``),
    ``num_nodes``, ``eos_node`` (``None`` without EOS tokens), ``eot_token`` (``None``), ``eos_tokens``,
    ``eos_token_ids``. See :mod:`genlm_core.trie.structure` for the numbering.
    """

    EOS = EOS
    EOT = EOT

    def __init__(
        self,
        decode: Iterable[bytes | Token] | TrieStructure,
        eos_tokens: Iterable[bytes | Token] | None = (),
        atomic_tokens: Iterable[bytes | Token] | None = (),
    ) -> None:
        if isinstance(decode, TrieStructure):
            self.structure = decode
        else:
            self.structure = TrieStructure(decode, eos_tokens or (), atomic_tokens or ())
        s = self.structure
        self.root = s.root
        self.eos_node = s.eos_node
        self.num_nodes = s.num_nodes
        self.children = s.children
        self.node2prefix = s.node2prefix
        self.word2leaf = s.word2leaf
        self.leaf2word = s.leaf2word
        self.leaf2token_id = s.leaf2token_id
        self.eot_token = EOT
        self.eot_sentinel = EOT  # genlm-bytes 0.2 name
        self.eos_tokens = s.eos_tokens
        self.eos_token_ids = s.eos_token_ids
        self.atomic_tokens = s.atomic_tokens

    # genlm-bytes' LazyTrieState reaches the structure through ``async_trie.trie``;
    # a plain trie answers ``.trie`` with itself so both spellings work.
    @property
    def trie(self) -> "BaseTokenByteTrie":
        return self

    def __len__(self) -> int:
        return self.num_nodes

    @property
    def decode(self) -> list[Any]:
        """The vocabulary by position (``Token`` objects, and symbols as given)."""
        return self.structure.decode

    @property
    def vocab_size(self) -> int:
        return self.structure.num_leaves

    def leaves_of(self, node: int) -> list[int]:
        """All end-of-token leaves hanging below ``node`` (duplicates included)."""
        return self.structure.leaves_of(node)

    @staticmethod
    def _mode(mode: Any) -> EOSMode:
        return coerce_mode(mode)

    def visualize(self, ws: Any = None) -> Any:
        """A ``graphviz.Digraph`` of the trie, optionally labelled with node weights
        ``ws`` (length ``num_nodes``, e.g. the output of :meth:`weight_sum`)."""
        from genlm_core.trie.viz import visualize

        return visualize(self, ws)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab={len(self.decode)}, nodes={self.num_nodes}, "
            f"eos={len(self.eos_token_ids)}, atomic={len(self.atomic_tokens)})"
        )
