"""``genlm.backend.cache``: genlm-backend's cache classes.

:class:`OutputCache` is genlm-core's bounded LRU (:class:`genlm_core.engine.caches.OutputCache`)
with genlm-backend's constructor and item syntax. :class:`TokenTrie` is the node type
genlm-backend's ``AsyncTransformer`` cached into; genlm-compat's backends do not cache
into it (genlm-core keeps whole contexts in the output cache and KV states in a prefix
cache): it is what ``AsyncTransformer.walk_cache`` returns, and a small trie of
next-token rows for code that builds its own.
"""

from __future__ import annotations

from typing import Any

from genlm.backend._surface import public_dir  # noqa: E402

from genlm_core.engine.caches import OutputCache as _CoreOutputCache

__all__ = ["OutputCache", "TokenTrie"]


class OutputCache(_CoreOutputCache):
    """``OutputCache(maxsize, move_to_cpu=False)``: ``cache[key] = tensor``,
    ``cache[key]`` (``KeyError`` when absent), ``key in cache``, ``len``, ``clear()``;
    least recently used entries are evicted beyond ``maxsize``. A stored tensor is a
    private copy (genlm-backend kept the caller's object). With ``move_to_cpu`` a tensor
    is held in host memory and ``cache[key]`` hands it back on the device it came from,
    as genlm-backend's did."""

    def __init__(self, maxsize: int, move_to_cpu: bool = False) -> None:
        super().__init__(max_entries=maxsize, max_bytes=None, to_cpu=move_to_cpu)
        self.maxsize = maxsize
        self.move_to_cpu = move_to_cpu

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)


class TokenTrie:
    """A trie of token ids whose nodes hold the next-token ``logprobs`` after their
    prefix and, optionally, ``past_key_values``."""

    def __init__(self, logprobs: Any = None) -> None:
        self.children: dict[int, TokenTrie] = {}
        self.logprobs = logprobs
        self.past_key_values: Any = None

    def __repr__(self) -> str:
        kids = ", ".join(f"{t}: {node!r}" for t, node in self.children.items())
        return f"{'*' if self.past_key_values is not None else ''}[{kids}]"

    def clear_kv_cache(self) -> None:
        self.past_key_values = None
        for node in self.children.values():
            node.clear_kv_cache()

    def has_token(self, token_id: int) -> bool:
        return token_id in self.children

    def get_token(self, token_id: int) -> "TokenTrie":
        return self.children[token_id]

    def add_token(self, token_id: int, logprobs: Any = None) -> "TokenTrie":
        self.children[token_id] = node = TokenTrie(logprobs)
        return node

    def extend_cache(self, next_token_index: int, token_ids: Any, logits: Any, base: int) -> "TokenTrie":
        """Add ``token_ids[next_token_index:]`` below this node; ``logits[j - base]`` are
        the logits after ``token_ids[: j + 1]`` (stored as float32 log-softmax on the CPU)."""
        import torch

        node = self
        for j in range(next_token_index, len(token_ids)):
            row = torch.log_softmax(logits[j - base], 0, dtype=torch.float32)
            node = node.add_token(token_ids[j], row.cpu())
        return node


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
