"""Bounded output cache: LRU over whole contexts, bounded by entries and by bytes.

The cache keeps a private, compact copy of every value it is given
(:func:`genlm_core.engine.memory.private_copy`), so its byte budget is what it really keeps
alive (a row viewed out of a batch tensor would keep the whole batch) and nothing a
producer or a caller does to its own tensor reaches the cache. :meth:`OutputCache.get`
returns the cached object itself: read it, never modify it (the backend hands its
callers copies).

A backend's output cache is the registered cache its config names
(``output_cache_impl``, default ``"output"``: :class:`OutputCache`), built by
:func:`output_cache_for`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from pydantic import Field

from genlm_core.config import GenlmConfig
from genlm_core.engine.memory import compact, private_copies, private_copy, sizeof
from genlm_core.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.config import BackendConfig
    from genlm_core.protocols import RowCache

__all__ = ["OutputCache", "OutputCacheConfig", "output_cache_for", "registered_cache", "sizeof"]


class OutputCacheConfig(GenlmConfig):
    """Bounds of an :class:`OutputCache`."""

    max_entries: int | None = Field(4096, ge=0, description="most cached contexts; None: no bound")
    max_bytes: int | None = Field(
        1 << 30, ge=0, description="most bytes held by cached results; None: no bound"
    )
    to_cpu: bool = Field(False, description="move tensors to the CPU before caching them")


class OutputCache:
    """LRU cache of next-token results keyed by the whole token tuple.

    Bounded by ``max_entries`` and by ``max_bytes`` (the sum of :func:`sizeof` of
    the stored values: the storage they keep alive); least recently used entries are
    evicted first. ``put`` stores a private compact copy of tensors and arrays;
    ``get`` returns the stored object, which callers must not modify. Thread-safe:
    the batcher's worker thread and the event loop may use it at once.
    """

    def __init__(
        self,
        max_entries: int | None = 4096,
        max_bytes: int | None = 1 << 30,
        to_cpu: bool = False,
    ) -> None:
        cfg = OutputCacheConfig(max_entries=max_entries, max_bytes=max_bytes, to_cpu=to_cpu)
        self.max_entries = cfg.max_entries
        self.max_bytes = cfg.max_bytes
        self.to_cpu = cfg.to_cpu
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @classmethod
    def from_config(cls, config: OutputCacheConfig) -> "OutputCache":
        return cls(config.max_entries, config.max_bytes, config.to_cpu)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            item = self._data.get(key)
            if item is None:
                self.misses += 1
                return default
            self._data.move_to_end(key)
            self.hits += 1
            return item[0]

    def __getitem__(self, key: Hashable) -> Any:
        sentinel = object()
        value = self.get(key, sentinel)
        if value is sentinel:
            raise KeyError(key)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        """Cache a private compact copy of ``value`` (the caller keeps its own object)."""
        self.put_many([(key, value)])

    __setitem__ = put

    def put_many(self, items: list[tuple[Hashable, Any]]) -> None:
        """:meth:`put` of each ``(key, value)``; tensors on a CUDA device are copied in one
        batched copy (:func:`~genlm_core.engine.memory.private_copies`)."""
        if self.max_entries == 0 or self.max_bytes == 0 or not items:
            return
        if self.to_cpu:
            copies = [self._cpu_copy(value) for _, value in items]
        else:
            copies = private_copies([value for _, value in items])
        with self._lock:
            for (key, _), value in zip(items, copies):
                size = sizeof(value)
                if self.max_bytes is not None and size > self.max_bytes:
                    continue  # larger than the whole budget: never cached
                old = self._data.pop(key, None)
                if old is not None:
                    self.nbytes -= old[1]
                self._data[key] = (value, size)
                self.nbytes += size
                self._evict()

    @staticmethod
    def _cpu_copy(value: Any) -> Any:
        """A private copy on the CPU (``to_cpu``): a device tensor moved, anything else copied."""
        device = getattr(value, "device", None)
        if hasattr(value, "to") and getattr(device, "type", device) not in (None, "cpu"):
            return compact(value.to("cpu"))  # a new tensor on the CPU
        return private_copy(value)

    def _evict(self) -> None:
        while self._data and (
            (self.max_entries is not None and len(self._data) > self.max_entries)
            or (self.max_bytes is not None and self.nbytes > self.max_bytes)
        ):
            _, (_, size) = self._data.popitem(last=False)
            self.nbytes -= size
            self.evictions += 1

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used."""
        with self._lock:
            return list(self._data.keys())

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.nbytes = 0

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._data),
            "bytes": self.nbytes,
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
        }


def output_cache_for(config: "BackendConfig") -> "RowCache | None":
    """The output cache ``config`` asks for: the registered cache ``output_cache_impl``,
    built from its config class with ``cache_size``, ``cache_bytes`` and ``cache_to_cpu``
    (None when ``cache_size`` is 0)."""
    if config.cache_size == 0:
        return None
    cls, reg = registered_cache(
        config.output_cache_impl,
        ("from_config", "get", "put", "__contains__", "clear", "stats"),
        "keep next-token rows",
        "a row cache such as 'output' in output_cache_impl",
    )
    cfg_cls = reg.load_config_class() or OutputCacheConfig
    options = {
        "max_entries": config.cache_size,
        "max_bytes": config.cache_bytes,
        "to_cpu": config.cache_to_cpu,
    }
    return cls.from_config(cfg_cls.build(reg.name, **options))


def registered_cache(name: str, methods: tuple[str, ...], role: str, fix: str) -> tuple[type, Any]:
    """The registered cache ``name`` (kind ``cache``) and its registration, checked to have
    ``methods``; else a :class:`ConfigError` saying it cannot ``role`` and to name ``fix``.
    The one lookup of both cache roles (output rows, KV prefixes)."""
    from genlm_core.registry import get_registry

    reg = get_registry().get("cache", name)
    cls = reg.load_target()
    missing = [m for m in methods if not hasattr(cls, m)]
    if missing:
        raise ConfigError(
            f"cache {reg.name!r} ({reg.target}) cannot {role}: it has no {', '.join(missing)}; name {fix}"
        )
    return cls, reg
