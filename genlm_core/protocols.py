"""The protocols plugins implement: LogprobBackend (and LoraBackend), Trie, Cache
(RowCache, PrefixKVCache), ByteModel.

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

__all__ = ["ByteModel", "Cache", "LogprobBackend", "LoraBackend", "PrefixKVCache", "RowCache", "Trie"]


@runtime_checkable
class LogprobBackend(Protocol):
    """A language model that returns full next-token log-probability vectors.

    Everything callers use (the CLI, ``genlm_core.tools.compare``, the byte model, SMC code)
    is stated here; :class:`genlm_core.engine.backend.BaseLogprobBackend` implements it once
    for every engine plugin.

    Output contract: ``next_token_logprobs*`` return a normalised float32 torch
    tensor of length ``len(byte_vocab)`` (one row per context for the batch
    versions), owned by the caller (it may modify it in place). Bad input raises
    ``ValueError`` for that caller only.

    * ``vocab_size``: ``len(byte_vocab)``, the width of every row;
    * ``eos_token_ids``: the default EOS ids (``sample(eos_token_ids=None)``), by the
      checkpoint policy of :mod:`genlm_core.engine.checkpoint`;
    * ``max_context_length``: the longest context accepted (``None``: no known limit);
    * ``dtype``: what the engine computes in (``"float32"``, ``"float16"``,
      ``"bfloat16"``); ``device``: where (``"cpu"``, ``"cuda"``, ``"mps"``...);
    * ``stats()``: counters (``"batcher"``, ``"output_cache"``, engine entries);
      ``info()``: what runs where (``"backend"``, ``"model"``, ``"device"``, ...);
    * ``close()``: stop the batcher (waiting callers get an error) and release the
      engine; the backend answers nothing afterwards. Also a (async) context manager.
    """

    tokenizer: Any
    byte_vocab: "list[Token]"
    str_vocab: list[str]
    vocab_size: int
    eos_token_ids: list[int]

    @property
    def max_context_length(self) -> int | None: ...

    @property
    def dtype(self) -> str: ...

    @property
    def device(self) -> Any: ...

    async def next_token_logprobs(self, token_ids: Sequence[int]) -> "torch.Tensor": ...

    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> "torch.Tensor": ...

    async def batch_next_token_logprobs(self, token_ids_list: Sequence[Sequence[int]]) -> "torch.Tensor": ...

    def batch_next_token_logprobs_sync(self, token_ids_list: Sequence[Sequence[int]]) -> "torch.Tensor": ...

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]: ...

    async def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]: ...

    def clear_cache(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@runtime_checkable
class LoraBackend(LogprobBackend, Protocol):
    """A LogprobBackend whose engine applies LoRA adapters (genlm-hf through peft,
    genlm-vllm through vLLM's LoRA support); the same names and meaning on each, kept by
    :class:`~genlm_core.engine.backend.BaseLogprobBackend` for every engine declaring the
    capability ``"lora"`` (``supports_lora``; the others refuse ``load_lora``).

    * ``load_lora(path, name="default")``: register the adapter folder ``path`` under
      ``name``. The active adapter does not change, so no result changes and no cache
      is dropped. A folder that does not exist, or a ``name`` already loaded, raises
      ``ValueError``.
    * ``set_lora(name="default")``: every later call uses adapter ``name`` (a name not
      loaded raises ``ValueError``). Drops the output cache, and any engine KV computed
      under another adapter (genlm-hf drops its prefix KV; vLLM keys its prefix cache
      by adapter, so genlm-vllm has none to drop).
    * ``clear_lora()``: back to the base model; drops the same caches as ``set_lora``.
    * ``active_lora``: the active adapter's name, ``None`` for the base model.

    Switching runs under the model lock: a batch already running finishes with the
    adapter it started with.
    """

    @property
    def active_lora(self) -> str | None: ...

    def load_lora(self, path: Any, name: str = "default") -> None: ...

    def set_lora(self, name: str = "default") -> None: ...

    def clear_lora(self) -> None: ...


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
    """A bounded cache of model results: a registered implementation of the kind ``cache``
    (``genlm_register_caches``) is one of the two roles below, and a backend resolves each
    by name from its config (``output_cache_impl``, ``prefix_cache_impl``)."""

    def clear(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


@runtime_checkable
class RowCache(Cache, Protocol):
    """A backend's output cache: next-token rows by whole context (the core's ``"output"``,
    :class:`genlm_core.engine.caches.OutputCache`).

    Built with ``cls.from_config(config)``, ``config`` the registration's config class
    (default :class:`~genlm_core.engine.caches.OutputCacheConfig`) holding ``max_entries``,
    ``max_bytes`` and ``to_cpu``. ``put`` keeps a private copy; ``get`` may return the
    stored object (the backend hands its callers copies)."""

    def get(self, key: Hashable, default: Any = None) -> Any: ...

    def put(self, key: Hashable, value: Any) -> None: ...

    def __contains__(self, key: Hashable) -> bool: ...


@runtime_checkable
class PrefixKVCache(Cache, Protocol):
    """Engine KV state per token prefix (the core's ``"prefix"``,
    :class:`genlm_core.engine.prefix_cache.PrefixCache`), used through
    :class:`~genlm_core.engine.kv_reuse.KVReuse`.

    Built with ``cls(budget, sizeof=..., on_evict_kv=...)``: ``budget`` in the unit
    ``sizeof`` counts (None: no bound), ``on_evict_kv`` told of every payload dropped."""

    budget: int | None
    sizeof: Any
    on_evict_kv: Any

    def deepest_kv(self, tokens: Sequence[int], max_depth: int | None = None) -> tuple[int, Any]: ...

    def insert(self, tokens: Sequence[int], *, kv: Any) -> None: ...

    def evict_lru_kv(self, keep: Any = None) -> Any: ...


@runtime_checkable
class ByteModel(Protocol):
    """A byte-level language model state: condition on bytes, get next-byte logprobs.

    A registered implementation (kind ``byte_model``) is built by
    :func:`genlm_core.load_byte_model` with ``await cls.initial(llm, config)``, ``config``
    the registration's config class."""

    async def __lshift__(self, byte: int) -> "ByteModel": ...

    def logp_next(self) -> Any: ...

    async def cleanup(self) -> None: ...
