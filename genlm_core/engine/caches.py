"""Bounded output cache: LRU over whole contexts, bounded by entries and by bytes.

The cache keeps a private, compact copy of every value it is given
(:func:`genlm_core.engine.memory.private_copy`), so nothing a producer or a caller does to
its own tensor reaches the cache. :meth:`OutputCache.adopt_many` is the producer's way
without a copy: the backend hands over the rows of a freshly normalised batch, views of
one tensor that nobody else holds (one block for the batch, where a copy each costs a
row's bytes on the CPU and an allocation per row on a GPU). The byte budget counts what
the cache really keeps alive: each storage once, however many entries view it, freed
when its last entry goes. :meth:`OutputCache.get` returns the cached object itself: read
it, never modify it (the backend hands its callers copies).

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
from genlm_core.engine.memory import cpu_copies, on_device, private_copies, sizeof, storage_of
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

    Bounded by ``max_entries`` and by ``max_bytes`` (the storage the stored values keep
    alive, each storage counted once: :func:`sizeof` of a value, or the block several
    adopted rows share); least recently used entries are evicted first. ``put`` stores a
    private compact copy of tensors and arrays, ``adopt_many`` the values themselves;
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
        # key -> (value, the identity of the storage it keeps alive)
        self._data: OrderedDict[Hashable, tuple[Any, Hashable]] = OrderedDict()
        # storage identity -> [bytes, entries keeping it]: nbytes is the sum of the bytes
        self._blocks: dict[Hashable, list[int]] = {}
        # key -> the device a value held in host memory (to_cpu) was put from
        self._origin: dict[Hashable, Any] = {}
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

    def get_back(self, key: Hashable, default: Any = None) -> Any:
        """:meth:`get`, on the device the value was put from: a copy where ``to_cpu`` holds
        it in host memory (as genlm-backend's ``move_to_cpu`` cache handed values back),
        the stored object otherwise."""
        value = self.get(key, default)
        origin = self._origin.get(key) if self._origin else None
        return value if origin is None or value is default else value.to(origin)

    def __getitem__(self, key: Hashable) -> Any:
        """:meth:`get_back` (on the device it was put from), or ``KeyError``."""
        sentinel = object()
        value = self.get_back(key, sentinel)
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
        origins = {}
        if self.to_cpu:  # a device's rows in one transfer (cpu_copies)
            copies = cpu_copies([value for _, value in items])
            origins = {key: value.device for key, value in items if on_device(value)}
        else:
            copies = private_copies([value for _, value in items])
        self._store([(key, value, storage_of(value)) for (key, _), value in zip(items, copies)], origins)

    def adopt_many(self, items: list[tuple[Hashable, Any]]) -> None:
        """Cache each ``(key, value)`` as it is, no copy: the producer gives the values up
        (nobody else may hold, modify or hand them out). For rows viewed out of one fresh
        batch tensor (the backend's normalised rows): the batch is kept as one block,
        counted once and freed with its last entry. Where the cache moves values to the
        CPU (``to_cpu``) and some are on a device, or a value's block is larger than the
        whole byte budget, the values are copied (:meth:`put_many`: a device's rows in one
        transfer) instead."""
        if self.max_entries == 0 or self.max_bytes == 0 or not items:
            return
        blocks = []
        base, block = None, None
        for _, value in items:  # views of one tensor (torch's ``_base``) share its storage
            view_of = getattr(value, "_base", None)
            if view_of is None or view_of is not base:
                base, block = view_of, storage_of(value)
            blocks.append(block)
        moved = self.to_cpu and any(on_device(value) for _, value in items)
        if moved or (self.max_bytes is not None and any(b[1] > self.max_bytes for b in blocks)):
            self.put_many(items)
            return
        self._store([(key, value, block) for (key, value), block in zip(items, blocks)])

    def _store(
        self,
        items: list[tuple[Hashable, Any, tuple[Hashable, int]]],
        origins: dict[Hashable, Any] | None = None,
    ) -> None:
        """Insert ``(key, value, block)``: ``block`` is ``(identity, bytes)`` of the storage
        the value keeps alive (:func:`~genlm_core.engine.memory.storage_of`); ``origins``:
        key -> the device a value moved to host memory came from."""
        with self._lock:
            for key, value, (ident, size) in items:
                if self.max_bytes is not None and size > self.max_bytes:
                    continue  # larger than the whole budget: never cached
                self._drop(key)
                self._data[key] = (value, ident)
                if origins and key in origins:
                    self._origin[key] = origins[key]
                held = self._blocks.get(ident)
                if held is None:
                    self._blocks[ident] = [size, 1]
                    self.nbytes += size
                else:
                    held[1] += 1
                self._evict()

    def _drop(self, key: Hashable) -> bool:
        """Remove ``key``'s entry (its block's bytes go with the block's last entry)."""
        old = self._data.pop(key, None)
        if old is None:
            return False
        self._origin.pop(key, None)
        held = self._blocks[old[1]]
        held[1] -= 1
        if held[1] == 0:
            del self._blocks[old[1]]
            self.nbytes -= held[0]
        return True

    def _evict(self) -> None:
        while self._data and (
            (self.max_entries is not None and len(self._data) > self.max_entries)
            or (self.max_bytes is not None and self.nbytes > self.max_bytes)
        ):
            self._drop(next(iter(self._data)))
            self.evictions += 1

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used."""
        with self._lock:
            return list(self._data.keys())

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._blocks.clear()
            self._origin.clear()
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
