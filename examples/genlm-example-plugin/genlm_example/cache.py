"""A first-in-first-out output cache, registered as the cache ``example-fifo``.

genlm-core's own output cache (``output``) is an LRU; this one evicts in the order
entries arrived, whatever was read since. A backend uses it with
``genlm_core.load(..., output_cache_impl="example-fifo")``; it is built like any output
cache, from :class:`genlm_core.engine.OutputCacheConfig` (``cache_size``,
``cache_bytes`` and ``cache_to_cpu`` of the backend's config).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from genlm_core.engine import OutputCacheConfig, private_copy, sizeof


class FifoCache:
    """Next-token rows by whole context, the oldest evicted first (bounded by entries and bytes)."""

    def __init__(self, max_entries: int | None, max_bytes: int | None, to_cpu: bool = False) -> None:
        self.max_entries, self.max_bytes, self.to_cpu = max_entries, max_bytes, to_cpu
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = self.hits = self.misses = self.evictions = 0

    @classmethod
    def from_config(cls, config: OutputCacheConfig) -> "FifoCache":
        return cls(config.max_entries, config.max_bytes, config.to_cpu)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            item = self._data.get(key)  # a hit leaves the order as it is
            if item is None:
                self.misses += 1
                return default
            self.hits += 1
            return item[0]

    def put(self, key: Hashable, value: Any) -> None:
        if self.to_cpu and hasattr(value, "cpu"):
            value = value.cpu()
        value = private_copy(value)  # the caller keeps its own object
        size = sizeof(value)
        with self._lock:
            old = self._data.pop(key, None)
            self.nbytes += size - (old[1] if old else 0)
            self._data[key] = (value, size)
            while self._data and (
                (self.max_entries is not None and len(self._data) > self.max_entries)
                or (self.max_bytes is not None and self.nbytes > self.max_bytes)
            ):
                self.nbytes -= self._data.popitem(last=False)[1][1]
                self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.nbytes = 0

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._data), "bytes": self.nbytes, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions}  # fmt: skip
