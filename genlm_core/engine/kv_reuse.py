"""Automatic KV prefix reuse for engines that hold their own KV state, written once.

An engine whose model call can resume from the KV state of a prefix (genlm-hf,
genlm-mlx, genlm-llamacpp) keeps that state in a :class:`KVReuse`: a core
:class:`~genlm_core.engine.prefix_cache.PrefixCache` (LRU under a budget) plus the counters
every such engine reports. The plugin keeps only its engine calls:

.. code-block:: python

    starts = self.kv.lookup(contexts)              # [(depth, kv)]: deepest proper prefix
    logits, kvs = engine.run(contexts, starts)     # compute the tokens past each depth
    self.kv.count(computed=..., reused=sum(d for d, _ in starts))
    for ctx, kv in zip(contexts, kvs):
        self.kv.store(ctx, kv)

:class:`KVCacheOptions` is the one pydantic mixin for the options that go with it
(``prefix_cache``, ``kv_cache_bytes``), and :class:`KVReuseBackend` the backend mixin
that gives ``cache_kv``, ``clear_kv_cache``, the cache controls and the statistics.

A "proper" prefix: the deepest cached prefix of a context is looked up at most
``len(ctx) - 1`` tokens deep, so the model always computes at least the last token
(its logits are the answer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field

from genlm_core.config import GenlmConfig
from genlm_core.engine.memory import sizeof as default_sizeof
from genlm_core.engine.prefix_cache import PrefixCache

__all__ = ["KVCacheOptions", "KVReuse", "KVReuseBackend"]


class KVCacheOptions(GenlmConfig):
    """The KV-reuse options of every engine with its own KV (a mixin of its config):
    ``class MyConfig(KVCacheOptions, BackendConfig)`` (its options then follow the common ones)."""

    prefix_cache: bool = Field(
        True,
        description=(
            "reuse the KV state of cached prefixes: run the model on the tokens past the deepest "
            "cached prefix only (off for models whose caches cannot be reused)"
        ),
    )
    kv_cache_bytes: int | None = Field(
        1 << 30, ge=0, description="bytes of KV state kept for prefix reuse (LRU; 0: none; None: no bound)"
    )


class KVReuse:
    """A prefix cache of engine KV payloads and the counters of the model calls using it.

    Args:
        budget: the cache's bound, in the unit ``sizeof`` counts (bytes by default;
            ``None``: no bound). ``0`` or ``enabled=False``: no reuse (no cache).
        sizeof: the size of a payload (default: the memory it keeps alive).
        on_evict: told of every payload the cache drops (payloads that are handles on
            engine memory, e.g. a llama.cpp KV sequence).
    """

    def __init__(
        self,
        budget: int | None,
        *,
        enabled: bool = True,
        sizeof: Callable[[Any], int] = default_sizeof,
        on_evict: Callable[[Any], None] | None = None,
    ) -> None:
        self.cache: PrefixCache | None = (
            PrefixCache(kv_budget_bytes=budget, sizeof=sizeof, on_evict_kv=on_evict)
            if enabled and budget != 0
            else None
        )
        self.forward_calls = 0
        self.tokens_computed = 0
        self.tokens_reused = 0

    @property
    def enabled(self) -> bool:
        return self.cache is not None

    def lookup(self, contexts: Sequence[Sequence[int]]) -> list[tuple[int, Any]]:
        """``(depth, kv)`` of the deepest cached proper prefix of every context
        (``(0, None)`` when none is cached or reuse is off). Marks them used."""
        cache = self.cache
        if cache is None:
            return [(0, None)] * len(contexts)
        return [cache.deepest_kv(c, max_depth=len(c) - 1) for c in contexts]

    def store(self, context: Sequence[int], kv: Any) -> bool:
        """Keep ``kv`` (the state of the whole ``context``); False when it is not kept
        (reuse off, no payload, or a payload larger than the whole budget)."""
        cache = self.cache
        if cache is None or kv is None:
            return False
        if cache.kv_budget_bytes is not None and cache.sizeof(kv) > cache.kv_budget_bytes:
            return False
        cache.insert(context, kv=kv)
        return True

    def count(self, computed: int, reused: int, calls: int = 1) -> None:
        """A model call (``calls``) that ran ``computed`` tokens and resumed ``reused`` from
        the cache (an engine counting one call in parts passes ``calls=0`` for the rest)."""
        self.forward_calls += calls
        self.tokens_computed += int(computed)
        self.tokens_reused += int(reused)

    def clear(self) -> None:
        """Drop every payload (``on_evict`` is told of each)."""
        if self.cache is not None:
            self.cache.clear()

    def stats(self) -> dict[str, Any]:
        """``{"forward_calls", "tokens_computed", "tokens_reused", "kv_reuse"}``."""
        return {
            "forward_calls": self.forward_calls,
            "tokens_computed": self.tokens_computed,
            "tokens_reused": self.tokens_reused,
            "kv_reuse": self.enabled,
        }


class KVReuseBackend:
    """Backend mixin (before :class:`~genlm_core.engine.backend.BaseLogprobBackend` in the bases)
    for an engine that keeps a :class:`KVReuse` in ``self.kv``.

    Gives ``prefix_cache`` (``None`` when reuse is off), ``kv_reuse``, the counters,
    ``cache_kv``, ``clear_kv_cache``, ``clear_cache`` dropping the KV too, and
    ``stats()["prefix_cache"]`` / ``stats()["engine"]`` (an engine adds its own entries
    with :meth:`_engine_stats`).
    """

    kv: KVReuse

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self.kv.cache

    @property
    def kv_reuse(self) -> bool:
        return self.kv.enabled

    @property
    def forward_calls(self) -> int:
        return self.kv.forward_calls

    @property
    def tokens_computed(self) -> int:
        return self.kv.tokens_computed

    @property
    def tokens_reused(self) -> int:
        return self.kv.tokens_reused

    def cache_kv(self, prompt_token_ids: Sequence[int]) -> None:
        """Compute ``prompt_token_ids`` now (its next-token row goes to the output cache)
        and keep its KV state, so later contexts that extend it run the model on their new
        tokens only (while the KV stays within the budget). Nothing runs when reuse is off
        or the prompt's KV is cached already."""
        ctx = self.validate(prompt_token_ids)  # type: ignore[attr-defined]
        cache = self.kv.cache
        if cache is None or cache.deepest_kv(ctx)[0] == len(ctx):
            return
        self.batcher.run_sync([ctx])  # type: ignore[attr-defined]

    def clear_kv_cache(self) -> None:
        """Drop every cached KV state (the output cache's rows stay)."""
        self.kv.clear()

    def _clear_engine_cache(self) -> None:
        self.kv.clear()

    def _engine_stats(self) -> dict[str, Any]:
        """Engine-specific entries of ``stats()["engine"]``. Engines override."""
        return {}

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = super().stats()  # type: ignore[misc]
        if self.kv.cache is not None:
            out["prefix_cache"] = self.kv.cache.stats()
        out["engine"] = {**self.kv.stats(), **self._engine_stats()}
        return out
