"""The KV pool's bound: ``kv_cache_bytes`` resolved against the model and its device, and
every value that cannot be a bound refused with a sentence naming the option, the value
and the fix.

* ``"auto"``: a quarter of the memory of the model's device (the GPU's free memory once the
  model is loaded; the machine's RAM, or its cgroup limit, on the CPU), at least
  :data:`MIN_AUTO_BYTES`;
* bytes: at least :data:`MIN_POOL_PAGES` pages of the model's KV and at most the device's
  memory (a bound no allocation can reach fails at load with the allocator's words, which
  name no option);
* ``None``: no bound (the pool grows with what it holds).

``0`` and ``prefix_cache=False`` keep no KV between calls: the engine's pool then holds
only the running call's KV, under the ``"auto"`` bound, and gives its memory back after
each call (:meth:`genlm_hf.pool.KVPool.trim`).
"""

from __future__ import annotations

from typing import Any

from genlm_core.registry.hardware import host_memory
from genlm_hf.pool import PAGE, KVLayout, KVPool, context_capacity

__all__ = ["MIN_AUTO_BYTES", "MIN_POOL_PAGES", "device_memory", "new_pool", "pool_bound", "too_long_for_pool"]

#: the least the bound resolves to under kv_cache_bytes="auto"
MIN_AUTO_BYTES = 2**30
#: the fewest pages a bound must hold: the reserved page, a context's page and its copy on
#: write, and one more (a context of 32 tokens)
MIN_POOL_PAGES = 4


def device_memory(device: Any) -> tuple[int, int]:
    """``(total, available)`` bytes of ``device`` (a torch device): the GPU's total and free
    memory; on the CPU the machine's RAM (or its cgroup limit) for both."""
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(total), int(free)
    total = host_memory()
    return total, total


def pool_bound(option: Any, device: Any, page_bytes: int) -> int | None:
    """The pool's bound in bytes for ``kv_cache_bytes=option`` (see the module doc), or a
    ``ValueError`` that names the option, the value and the fix."""
    if option is None:
        return None
    total, available = device_memory(device)
    if option == "auto":
        return max(MIN_AUTO_BYTES, available // 4)
    if isinstance(option, bool) or not isinstance(option, int):
        raise ValueError(
            f"kv_cache_bytes={option!r} is not a number of bytes: pass bytes (e.g. 2**30), 'auto', "
            "0 (keep no KV between calls) or None (no bound)"
        )
    least = MIN_POOL_PAGES * page_bytes
    if option < least:
        raise ValueError(
            f"kv_cache_bytes={option} holds less than {MIN_POOL_PAGES} pages of this model's KV (a page of "
            f"{PAGE} tokens takes {page_bytes:,} bytes): pass at least {least} (a context of "
            f"{context_capacity(MIN_POOL_PAGES)} tokens), 'auto', or 0 to keep no KV between calls"
        )
    if option > total:
        where = "GPU" if device.type == "cuda" else "machine"
        raise ValueError(
            f"kv_cache_bytes={option} is more than this {where}'s memory ({total:,} bytes): pass at most "
            f"{total}, or 'auto' (a quarter of the available memory, {max(MIN_AUTO_BYTES, available // 4):,} bytes)"
        )
    return option


def new_pool(layout: KVLayout, bound: int | None) -> KVPool:
    """The pool under ``bound``; an allocation the device refuses is a sentence naming
    kv_cache_bytes (the allocator's own names no option)."""
    try:
        return KVPool(layout, bound)
    except (RuntimeError, MemoryError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(
            f"kv_cache_bytes={bound}: the KV pool could not reserve its bound on {layout.device} "
            f"({type(exc).__name__}: {first}); pass a smaller kv_cache_bytes or 'auto'"
        ) from exc


def too_long_for_pool(pool: KVPool, tokens: int, bound: int | None = None) -> str:
    """Why a context of ``tokens`` tokens does not fit in ``pool``'s bound (``bound``: the
    bytes it was given, else its whole pages), and the kv_cache_bytes it needs (its pages, a
    copy on write, the reserved page)."""
    need = pool.bytes_to_hold(tokens)
    given = bound if bound is not None else (pool.max_pages or 0) * pool.page_bytes
    return (
        f"the KV pool's bound (kv_cache_bytes={given}) holds a context of at "
        f"most {pool.capacity()} tokens of this model's KV ({pool.layout.column_bytes:,} bytes a token); a "
        f"context of {tokens} tokens needs kv_cache_bytes >= {need}: raise it in load(), or shorten the context"
    )
