"""Cache controls: clearing the output cache and the engine's, and KV reuse
(``cache_kv``, ``clear_kv_cache``, ``prefix_cache``). A mixin of
:class:`~genlm_core.engine.backend.BaseLogprobBackend`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.protocols import PrefixKVCache

__all__ = ["CacheControls"]


class CacheControls:
    """``clear_cache``, ``cache_kv``, ``clear_kv_cache`` and what KV reuse keeps."""

    def clear_cache(self) -> None:
        """Drop the output cache and engine caches (the engine's, then the KV reuse it was lent)."""
        if self.output_cache is not None:
            self.output_cache.clear()
        with self.engine_lock:
            self._clear_engine_caches()

    def _clear_engine_caches(self) -> None:
        """The kept KV (handed back to the engine), then the engine's caches (under the engine lock)."""
        if self.kv_calls is not None:
            self.kv_calls.clear()
        self.engine.clear_cache()

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
