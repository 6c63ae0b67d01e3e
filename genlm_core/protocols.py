"""The protocols plugins implement: LogprobBackend, Trie, Cache, ByteModel.

They are ``runtime_checkable`` so ``isinstance(obj, LogprobBackend)`` checks the
surface. Types that would need torch are strings, so importing this module stays
cheap.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.token import Token

__all__ = ["LogprobBackend", "Trie", "Cache", "ByteModel", "PROTOCOL_KINDS"]


@runtime_checkable
class LogprobBackend(Protocol):
    """A language model that returns full next-token log-probability vectors.

    Output contract: ``next_token_logprobs*`` return a normalised float32 torch
    tensor of length ``len(byte_vocab)`` (one row per context for the batch
    versions). Bad input raises ``ValueError`` for that caller only.
    """

    tokenizer: Any
    byte_vocab: "list[Token]"
    str_vocab: list[str]

    async def next_token_logprobs(self, token_ids: Sequence[int]) -> "torch.Tensor": ...

    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> "torch.Tensor": ...

    async def batch_next_token_logprobs(self, token_ids_list: Sequence[Sequence[int]]) -> "torch.Tensor": ...

    def batch_next_token_logprobs_sync(self, token_ids_list: Sequence[Sequence[int]]) -> "torch.Tensor": ...

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int],
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]: ...

    async def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int],
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]: ...

    def clear_cache(self) -> None: ...


@runtime_checkable
class Trie(Protocol):
    """Token-character trie: masses of every byte prefix under a token distribution.

    One signature for every implementation (``genlm_core.trie.TokenByteTrie``,
    ``TorchTokenByteTrie``; ``AsyncTokenByteTrie`` has the same arguments plus
    ``key=`` and is awaited):

    * ``weight_sum(ws, mode=WITHOUT_EOS, *, out=None, lazy=False)``: ``lazy=True``
      may return masses computed on access (``m[node]``, ``m.take(nodes)``;
      ``np.asarray(m)`` computes every node) or, where the implementation
      cannot, the eager result (an optional class attribute ``computes_lazily``
      says which; missing means eager);
    * ``weight_max(ws, mode=WITHOUT_EOS, *, out=None)``;
    * the ``batch_`` versions take ``(batch, len(vocab))`` weights.

    Weights must be finite for sums and NaN-free for max; anything else raises
    ``genlm_core.trie.base.NonFiniteWeightsError`` (a ``ValueError``).
    """

    root: int

    def weight_sum(self, ws: Any, mode: Any = ..., *, out: Any = None, lazy: bool = False) -> Any: ...

    def weight_max(self, ws: Any, mode: Any = ..., *, out: Any = None) -> Any: ...

    def batch_weight_sum(self, ws: Any, mode: Any = ..., *, out: Any = None, lazy: bool = False) -> Any: ...

    def batch_weight_max(self, ws: Any, mode: Any = ..., *, out: Any = None) -> Any: ...


@runtime_checkable
class Cache(Protocol):
    """A bounded cache of model results."""

    def clear(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


@runtime_checkable
class ByteModel(Protocol):
    """A byte-level language model state: condition on bytes, get next-byte logprobs."""

    async def __lshift__(self, byte: int) -> "ByteModel": ...

    def logp_next(self) -> Any: ...

    async def cleanup(self) -> None: ...


PROTOCOL_KINDS: dict[str, type] = {
    "backend": LogprobBackend,
    "trie": Trie,
    "cache": Cache,
    "byte_model": ByteModel,
}

CacheKey = Hashable
