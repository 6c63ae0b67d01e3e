"""The core's prefix cache of engine KV payloads, and the counters of the calls using it.

:class:`KVReuse` is the core's own (:class:`~genlm_core.engine.kv_calls.KVCalls` holds one
per engine that declares ``"resume"``): a prefix cache (the registered cache named by
``prefix_cache_impl``, by default the core's
:class:`~genlm_core.engine.prefix_cache.PrefixCache`: LRU under a budget), the engine
resources its payloads read (counted, handed back to the engine when nothing reads
them) and the counters every engine reports. Engines never see it: they receive rows to
resume and hand payloads back (:mod:`genlm_core.engine.kv_rows`).

The backend holding such an engine offers ``cache_kv``, ``clear_kv_cache``,
``prefix_cache`` and the counters (:class:`~genlm_core.engine.backend.BaseLogprobBackend`).
:class:`KVCacheOptions` is the one pydantic mixin for the options that go with it
(``prefix_cache``, ``kv_cache_bytes``, ``prefix_cache_impl``).

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
from genlm_core.protocols import PrefixKVCache

__all__ = ["ComputeCounters", "KVCacheOptions", "KVReuse", "prefix_cache_class", "too_large_for_budget"]


class ComputeCounters:
    """The counters every engine reports in ``stats()["engine"]``, with one meaning:
    ``forward_calls`` model calls (one per batch), ``tokens_computed`` context tokens the
    model ran, ``tokens_reused`` context tokens resumed from kept KV instead (a prefix
    cache's, vLLM's prefix cache or kept sessions). :class:`KVReuse` keeps one; an engine
    that reuses KV its own way (vLLM) keeps one of its own."""

    def __init__(self) -> None:
        self.forward_calls = 0
        self.tokens_computed = 0
        self.tokens_reused = 0

    def count(self, computed: int, reused: int, calls: int = 1) -> None:
        """A model call (``calls``) that ran ``computed`` tokens and resumed ``reused`` from
        kept KV (an engine counting one call in parts passes ``calls=0`` for the rest)."""
        self.forward_calls += calls
        self.tokens_computed += int(computed)
        self.tokens_reused += int(reused)

    def stats(self) -> dict[str, int]:
        """``{"forward_calls", "tokens_computed", "tokens_reused"}``."""
        return {
            "forward_calls": self.forward_calls,
            "tokens_computed": self.tokens_computed,
            "tokens_reused": self.tokens_reused,
        }


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
    prefix_cache_impl: str = Field(
        "prefix",
        min_length=1,
        description="name of the registered cache that keeps the KV prefixes (`genlm backends --all` lists them)",
    )


def prefix_cache_class(name: str) -> type:
    """The registered cache ``name`` (kind ``cache``), checked to be a prefix KV cache."""
    from genlm_core.engine.caches import registered_cache

    cls, _ = registered_cache(
        name,
        ("deepest_kv", "insert", "evict_lru_kv", "clear", "stats"),
        "keep KV prefixes",
        "a prefix cache such as 'prefix' in prefix_cache_impl",
    )
    return cls


def too_large_for_budget(tokens: int, size: int, budget: int, option: str) -> None:
    """Warn that the KV of a ``tokens``-token context (``size`` in the budget's unit) is
    larger than the whole prefix-cache budget (``option=budget``): it is computed, never
    kept, so every call over it computes it from its start. The one sentence for it:
    :meth:`KVReuse.store` says it, and an engine that leaves such payloads out itself
    (genlm-mlx: no copy of KV it would not keep) says it through this."""
    from genlm_core.engine.progress import note

    note(
        f"the prefix cache cannot keep the KV of a {tokens}-token context: it takes {size} "
        f"against the whole budget ({option}={budget}), so every call over it computes it "
        f"from its start. Raise {option} in load() to at least {size} (more to keep "
        "particles' tokens too), or shorten the prompt",
        advice=True,
    )


class KVReuse:
    """A prefix cache of engine KV payloads, the engine resources they read, and the
    counters of the model calls using it.

    Args:
        budget: the cache's bound, in the unit ``sizeof`` counts (bytes by default;
            ``None``: no bound). ``0`` or ``enabled=False``: no reuse (no cache).
        sizeof: the size of a payload (default: the memory it keeps alive).
        on_evict: told of every payload the cache drops.
        impl: the registered prefix cache to keep the payloads in (``prefix_cache_impl``).
        owner: the engine resource a payload reads (None: the payload owns its memory).
            Several cached payloads and running calls may read one owner (llama.cpp:
            prefixes of one KV sequence); :meth:`hold` counts the calls. When nothing
            reads an owner any more, ``release(owner)`` frees it.
        release: frees an owner nothing reads.
        budget_option: the load() option that sets ``budget`` (named in the warning below).

    A budget smaller than what one step keeps drops KV stored since the last lookup
    before any call reads it, and the next call computes those contexts from their start
    (a step can take several times longer; docs/architecture.md has the measurement):
    the first time, a WARNING names the budget and the option (``self_evictions`` counts
    them).

    :class:`~genlm_core.engine.kv_calls.KVCalls` makes one from the engine's
    :class:`~genlm_core.engine.kv_rows.KVPolicy`.
    """

    def __init__(
        self,
        budget: int | None,
        *,
        enabled: bool = True,
        sizeof: Callable[[Any], int] = default_sizeof,
        on_evict: Callable[[Any], None] | None = None,
        impl: str = "prefix",
        owner: Callable[[Any], Any] | None = None,
        release: Callable[[Any], None] | None = None,
        budget_option: str = "kv_cache_bytes",
    ) -> None:
        self._on_evict = on_evict
        self.budget_option = budget_option
        #: payloads stored since the last lookup (id -> context), and how many of them the
        #: cache dropped before a lookup could find them
        self._unread: dict[int, Sequence[int]] = {}
        self._storing: Sequence[int] | None = None  # the context being stored
        self.self_evictions = 0
        #: contexts whose KV alone was larger than the whole budget (not kept)
        self.oversized = 0
        self._owner = owner
        self._release = release
        #: id(owner) -> [owner, readers]: cached payloads plus calls holding it
        self._readers: dict[int, list[Any]] = {}
        self.cache: PrefixKVCache | None = (
            prefix_cache_class(impl)(budget, sizeof=sizeof, on_evict_kv=self._evicted)
            if enabled and budget != 0
            else None
        )
        #: the model calls using the cache (:class:`ComputeCounters`)
        self.counters = ComputeCounters()

    @classmethod
    def for_config(
        cls,
        config: Any,
        budget: int | None,
        *,
        name: str = "backend",
        problem: str | None = None,
        sizeof: Callable[[Any], int] | None = None,
        budget_option: str = "kv_cache_bytes",
        owner: Callable[[Any], Any] | None = None,
        release: Callable[[Any], None] | None = None,
        on_evict: Callable[[Any], None] | None = None,
    ) -> "KVReuse":
        """The KV reuse of an engine's :class:`~genlm_core.engine.kv_rows.KVPolicy` under ``config``'s options
        (:class:`KVCacheOptions`): on when ``prefix_cache`` is, ``budget`` is not 0 and the
        model has no ``problem``. A model that cannot reuse KV while reuse was asked for
        gets a warning."""
        import warnings

        wanted = bool(getattr(config, "prefix_cache", True)) and budget != 0
        if wanted and problem is not None:
            warnings.warn(
                f"{name}: this model cannot reuse KV state ({problem}); prefix caching is disabled",
                UserWarning,
                stacklevel=4,
            )
        return cls(
            budget,
            enabled=wanted and problem is None,
            sizeof=sizeof or default_sizeof,
            impl=getattr(config, "prefix_cache_impl", "prefix"),
            owner=owner,
            release=release,
            budget_option=budget_option,
            on_evict=on_evict,
        )

    @property
    def enabled(self) -> bool:
        return self.cache is not None

    @property
    def forward_calls(self) -> int:
        return self.counters.forward_calls

    @property
    def tokens_computed(self) -> int:
        return self.counters.tokens_computed

    @property
    def tokens_reused(self) -> int:
        return self.counters.tokens_reused

    def lookup(self, contexts: Sequence[Sequence[int]]) -> list[tuple[int, Any]]:
        """``(depth, kv)`` of the deepest cached proper prefix of every context
        (``(0, None)`` when none is cached or reuse is off). Marks them used."""
        cache = self.cache
        if cache is None:
            return [(0, None)] * len(contexts)
        self._unread.clear()
        return [cache.deepest_kv(c, max_depth=len(c) - 1) for c in contexts]

    def store(self, context: Sequence[int], kv: Any) -> bool:
        """Keep ``kv`` (the state of the whole ``context``); False when it is not kept
        (reuse off, no payload, or a payload larger than the whole budget). Storing may
        evict older payloads; an owner the stored payload reads is counted first, so it
        is not released by that eviction."""
        cache = self.cache
        if cache is None or kv is None:
            return False
        if cache.budget is not None and (size := cache.sizeof(kv)) > cache.budget:
            self._too_large(len(context), size, cache.budget)
            return False
        self._read(kv, +1)
        self._storing = context  # an eviction now is the budget's (not a clear's, not on demand)
        try:
            cache.insert(context, kv=kv)
        finally:
            self._storing = None
        self._unread[id(kv)] = context
        return True

    def hold(self, owners: Sequence[Any]) -> "_Held":
        """``with kv.hold(owners):`` a call reading ``owners`` (engine resources, see
        ``owner``) keeps them from being released while it stores and evicts payloads;
        on exit, an owner nothing else reads is released."""
        return _Held(self, owners)

    def _read(self, payload: Any, delta: int) -> None:
        owner = self._owner(payload) if self._owner is not None else None
        if owner is not None:
            self._count(owner, delta)

    def _count(self, owner: Any, delta: int) -> None:
        entry = self._readers.setdefault(id(owner), [owner, 0])
        entry[1] += delta
        if entry[1] <= 0:
            del self._readers[id(owner)]
            if self._release is not None:
                self._release(owner)

    def _evicted(self, payload: Any) -> None:
        dropped = self._unread.pop(id(payload), None)
        # (a payload replaced by the one stored for its own context is no loss)
        if dropped is not None and self._storing is not None and dropped != self._storing:
            self._dropped_unread()
        if self._on_evict is not None:
            self._on_evict(payload)
        self._read(payload, -1)

    def _too_large(self, tokens: int, size: int, budget: int) -> None:
        """A context's KV larger than the whole budget is computed, not kept: every call
        over it computes it from its start. Said once (``oversized`` counts them)."""
        self.oversized += 1
        if self.oversized == 1:
            too_large_for_budget(tokens, size, budget, self.budget_option)

    def _dropped_unread(self) -> None:
        self.self_evictions += 1
        if self.self_evictions == 1:
            from genlm_core.engine.progress import note

            budget = self.cache.budget if self.cache is not None else None
            note(
                f"the prefix cache dropped KV it had just stored, before any call read it: its "
                f"budget ({self.budget_option}={budget}) holds less than the contexts one step "
                "keeps, so the next call computes some of them from their start (a step can take "
                f"10x longer). Raise {self.budget_option} in load(), or run fewer or shorter "
                "contexts at once",
                advice=True,
            )

    def readers(self, owner: Any) -> int:
        """How many cached payloads and running calls read ``owner``."""
        entry = self._readers.get(id(owner))
        return entry[1] if entry is not None else 0

    def count(self, computed: int, reused: int, calls: int = 1) -> None:
        """A model call (``calls``) that ran ``computed`` tokens and resumed ``reused`` from
        the cache (an engine counting one call in parts passes ``calls=0`` for the rest)."""
        self.counters.count(computed, reused, calls)

    def clear(self) -> None:
        """Drop every payload (``on_evict`` is told of each; owners nothing reads are released)."""
        if self.cache is not None:
            self.cache.clear()

    def forget(self) -> None:
        """Drop every payload and owner count without releasing anything: the engine has
        freed all of its KV memory itself (llama.cpp emptied its whole KV cache)."""
        release, self._release = self._release, None
        on_evict, self._on_evict = self._on_evict, None
        try:
            self.clear()
        finally:
            self._release, self._on_evict = release, on_evict
            self._readers.clear()

    def stats(self) -> dict[str, Any]:
        """``{"forward_calls", "tokens_computed", "tokens_reused", "kv_reuse"}``."""
        return {**self.counters.stats(), "kv_reuse": self.enabled}


class _Held:
    """:meth:`KVReuse.hold`'s context manager."""

    def __init__(self, kv: KVReuse, owners: Sequence[Any]) -> None:
        self.kv = kv
        self.owners = list({id(o): o for o in owners}.values())

    def __enter__(self) -> "_Held":
        for owner in self.owners:
            self.kv._count(owner, +1)
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner in self.owners:
            self.kv._count(owner, -1)
