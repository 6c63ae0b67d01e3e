"""Cache controls: clearing the output cache and the engine's, and KV reuse
(``cache_kv``, ``clear_kv_cache``, ``prefix_cache``). A part of
:class:`~genlm_core.engine.backend.BaseLogprobBackend` (its ``cache_controls``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from genlm_core.engine.contexts import Context

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.engine.batching import AutoBatcher
    from genlm_core.engine.contract import Engine
    from genlm_core.engine.kv_calls import KVCalls
    from genlm_core.protocols import PrefixKVCache, RowCache

__all__ = ["CacheControls"]


class CacheControls:
    """``clear_cache``, ``cache_kv``, ``clear_kv_cache`` and what KV reuse keeps.

    Args:
        engine: clears its own caches (``clear_cache``).
        engine_lock: held while the engine's caches and the kept KV are cleared.
        output_cache: the rows kept by context (None: no output cache).
        kv_calls: the KV kept for an engine that resumes from it (None: none kept).
        batcher: computes a prompt to cache (its row goes to the output cache).
        validate: checks a prompt to cache first: the backend's ``validate``.
    """

    def __init__(
        self,
        engine: Engine,
        engine_lock: threading.RLock,
        output_cache: RowCache | None,
        kv_calls: KVCalls | None,
        batcher: AutoBatcher[tuple[int, ...], Any],
        validate: Callable[[Any], Context],
    ) -> None:
        self.engine = engine
        self.engine_lock = engine_lock
        self.output_cache = output_cache
        self.kv_calls = kv_calls
        self.batcher = batcher
        self.validate = validate

    def clear_cache(self) -> None:
        """Drop the output cache and engine caches (the engine's, then the KV reuse it was lent)."""
        if self.output_cache is not None:
            self.output_cache.clear()
        with self.engine_lock:
            self.clear_engine_caches()

    def clear_engine_caches(self) -> None:
        """The kept KV (handed back to the engine), then the engine's caches (under the engine lock)."""
        if self.kv_calls is not None:
            self.kv_calls.clear()
        self.engine.clear_cache()

    def drop_stale(self, engine_caches: bool) -> None:
        """What a change of the model's weights (a LoRA switch) makes stale: the output
        cache's rows and, with ``engine_caches``, the engine's (under the engine lock)."""
        if self.output_cache is not None:
            self.output_cache.clear()
        if engine_caches:
            self.clear_engine_caches()

    @property
    def prefix_cache(self) -> "PrefixKVCache | None":
        """The engine's KV prefix cache (None: the engine keeps none, or reuse is off)."""
        kv = self.kv_calls
        return kv.reuse.cache if kv is not None else None

    @property
    def kv_reuse(self) -> bool:
        """Whether later contexts resume from the engine KV of cached prefixes."""
        kv = self.kv_calls
        return kv is not None and kv.reuse.enabled

    def cache_kv(self, prompt_token_ids: Sequence[int]) -> None:
        """Compute ``prompt_token_ids`` now (its next-token row goes to the output cache)
        and keep its KV state, so later contexts that extend it run the model on their new
        tokens only (while the KV stays within the budget). Nothing runs when the engine
        keeps no KV, or the prompt's KV is cached already."""
        ctx = self.validate(prompt_token_ids)
        cache = self.prefix_cache
        if cache is None or cache.deepest_kv(ctx)[0] == len(ctx):
            return
        self.batcher.run_sync([ctx])

    def clear_kv_cache(self) -> None:
        """Drop every cached KV state (the output cache's rows stay)."""
        if self.kv_calls is not None:
            with self.engine_lock:
                self.kv_calls.clear()
