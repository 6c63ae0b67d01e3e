"""genlm-hf's KV memory: one pool of pages that every context's KV lives in.

A context's KV is a :class:`KVSeq`: the pages holding its columns, in order, and its
length. Pages are :data:`PAGE` token columns of every layer's keys and values; the pool
keeps them in one tensor ``[n_layers, 2, kv_heads, pages * PAGE, head_dim]`` (a column's
flat index is its *slot*: ``page * PAGE + column``), so a context's KV is never copied to
be kept, looked up, forked or extended:

* a context that extends a kept one forks it (:meth:`KVSeq.fork`: the same pages, one
  reference more on each) and writes its new tokens' KV into the next free columns of its
  last page, or of new pages (:meth:`KVSeq.extend`);
* a page is shared by every context whose prefix it holds: a prompt that 64 particles
  share is held once, and a resampled particle copies a page table, not KV;
* columns are written once: a page records how many of its columns are written
  (``used``), and a context may write the next column of its last page only if no other
  context wrote there first; otherwise it copies the page's first columns to a page of
  its own (copy on write, at most ``PAGE - 1`` columns, once per fork).

A page is freed when the last context holding it releases it (:meth:`KVSeq.release`).
On the CPU the pool's tensor reserves ``max_bytes`` at once (memory becomes resident as
pages are written, lowest pages first, and freed pages are reused first); on a GPU it
grows by doubling up to ``max_bytes`` (a copy per doubling). Before a pass, the pages
it may take are counted (:meth:`KVPool.pages_to_extend`) and what the bound lacks for them
(:meth:`KVPool.shortfall`) is released by the core, which keeps the contexts (its
prefix cache, genlm_core.engine.kv_calls), or the pass runs in parts; a take that finds
no page raises :class:`PoolFullError`. So ``max_bytes`` bounds every byte of KV the engine
holds, kept prefixes and the rows of the pass running alike: the pool never passes it
(a context longer than :meth:`KVPool.capacity` is refused before it reaches the engine).
:meth:`KVPool.trim` gives the memory of free pages back to the OS on the CPU.

Page 0 is never handed out: its first column is where padded positions of a pass write
and read (finite values, masked out), so a pass needs no branch for padding.

Page arithmetic lives here only: the passes ask a context for its slots
(:meth:`KVSeq.slots`), the columns it shares with others (:meth:`KVSeq.shared_columns`)
and whether they lie in order (:meth:`KVSeq.contiguous_start`), and the attention asks
the pool for a layer's keys and values (:meth:`KVPool.layer_kv`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch

from genlm_hf.host_memory import drop_pages, no_huge_pages

__all__ = ["PAGE", "PAD_SLOT", "KVLayout", "KVPool", "KVSeq", "PoolFullError", "context_capacity"]

#: token columns per page
PAGE = 16
#: the slot padded positions write and read (column 0 of the reserved page 0)
PAD_SLOT = 0
#: the pool's first size, in pages (it doubles from there, up to its bound)
_FIRST_PAGES = 64


def context_capacity(pages: int, page: int = PAGE) -> int:
    """The longest context a pool of ``pages`` pages holds alone: its pages plus one copied
    on write, beside the reserved page."""
    return max(0, pages - 2) * page


class PoolFullError(RuntimeError):
    """No page is free, the pool is at its bound and nothing kept can be released."""


class KVLayout(NamedTuple):
    """The shape of one model's KV: ``layers`` blocks of ``heads`` KV heads of
    ``head_dim``, in ``dtype`` on ``device``."""

    layers: int
    heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @property
    def column_bytes(self) -> int:
        """Bytes of one token's keys and values over every layer."""
        return self.layers * 2 * self.heads * self.head_dim * self.dtype.itemsize

    @property
    def page_bytes(self) -> int:
        """Bytes of one page of :data:`PAGE` columns."""
        return self.column_bytes * PAGE


class KVPool:
    """Pages of KV columns for one model (see the module doc).

    Args:
        layout: the model's KV layout.
        max_bytes: the most bytes the pool's tensor may take (None: no bound). At least
            two pages (the reserved one and one to use) are always allowed.
        page: token columns per page.
    """

    def __init__(self, layout: KVLayout, max_bytes: int | None, page: int = PAGE) -> None:
        self.layout = layout
        self.page = page
        self.page_bytes = layout.column_bytes * page
        self.max_pages = None if max_bytes is None else max(2, max_bytes // self.page_bytes)
        first = _FIRST_PAGES if self.max_pages is None else min(_FIRST_PAGES, self.max_pages)
        if self.max_pages is not None and layout.device.type == "cpu":
            # the whole bound at once: on the CPU untouched memory is only reserved (resident
            # as pages are written), and the tensor never moves (no copy, no transient double)
            first = self.max_pages
        self.storage = self._new_storage(first)
        if layout.device.type == "cpu":
            start = self.storage.data_ptr()
            no_huge_pages(start, start + self.storage.numel() * self.storage.element_size())
        self.storage[:, :, :, :page].zero_()  # the padding page: finite values
        #: per page: contexts holding it, and columns written
        self.refs = [0] * first
        self.used = [0] * first
        self.refs[0] = 1  # reserved, never freed
        #: pages below :attr:`touched` released since (taken first, last released first);
        #: pages from :attr:`touched` up are free too and taken in order, lowest first
        self._free: list[int] = []
        self.grown = 0  # doublings of the tensor (each moves it: views and captures of it go stale)
        self.copied_columns = 0  # columns copied on write (forks that wrote a shared page)
        #: one past the highest page taken since the pool began or was trimmed (what it has
        #: written: on the CPU, about what of it is resident)
        self.touched = 1

    def _new_storage(self, pages: int) -> torch.Tensor:
        lay = self.layout
        return torch.empty(
            (lay.layers, 2, lay.heads, pages * self.page, lay.head_dim), dtype=lay.dtype, device=lay.device
        )

    # ------------------------------------------------------------------ pages
    @property
    def pages(self) -> int:
        """Pages the tensor holds now."""
        return len(self.refs)

    @property
    def free_pages(self) -> int:
        return len(self._free) + self.pages - self.touched

    @property
    def pages_in_use(self) -> int:
        return self.pages - 1 - self.free_pages

    @property
    def nbytes(self) -> int:
        """Bytes of the pool's tensor."""
        return self.storage.numel() * self.storage.element_size()

    def pages_holding(self, columns: int) -> int:
        """The pages that ``columns`` columns fill, the last one partly."""
        return (columns + self.page - 1) // self.page

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s keys and values, each ``[heads, slots, head_dim]`` (views of the
        pool's tensor: a slot's column is ``[:, slot]``)."""
        store = self.storage[layer]
        return store[0], store[1]

    def take(self) -> int:
        """A free page (grown into when none is free), holding one reference; raises
        :class:`PoolFullError` when none is left (room is made before a pass: :meth:`shortfall`)."""
        while not self.free_pages:
            if not self._grow():
                raise PoolFullError(
                    f"hf: the KV pool is full ({self.pages_in_use} pages of {self.page} tokens, "
                    f"{self.nbytes} bytes) and every page is used by the running pass"
                )
        if self._free:
            p = self._free.pop()
        else:
            p = self.touched
            self.touched += 1
        self.refs[p] = 1
        self.used[p] = 0
        return p

    def pages_for(self, spans: Iterable[tuple[int, int]]) -> int:
        """The most pages extending contexts takes, each ``(length, depth)``: a context
        forked at ``depth`` tokens and extended to ``length``: a new page per ``page``
        columns past the depth's last full page, and one more where that page is shared
        and may be copied on write."""
        P = self.page
        return sum((n + P - 1) // P - (d + P - 1) // P + (1 if d % P else 0) for n, d in spans)

    def pages_to_extend(self, forks: Iterable[tuple["KVSeq | None", int, int]]) -> int:
        """The pages extending forks takes, exactly, each ``(source, depth, length)``: a
        context forked from ``source`` at ``depth`` tokens and extended to ``length``. As
        :meth:`pages_for`, but the partial page at ``depth`` is copied only where the fork
        cannot write on in place (:meth:`KVSeq.extend`: its written columns do not end at
        ``depth``, or another fork of the same call writes on there first): a particle's
        step that extends its own last context takes no page until it fills one."""
        P = self.page
        total = 0
        writers: set[int] = set()
        used = self.used
        for source, depth, length in forks:
            total += (length + P - 1) // P - (depth + P - 1) // P
            col = depth % P
            if col:
                page = source.pages[depth // P] if source is not None else -1
                if page >= 0 and used[page] == col and page not in writers:
                    writers.add(page)  # the first fork writes on in place
                else:
                    total += 1
        return total

    def shortfall(self, pages: int) -> int:
        """How many of ``pages`` pages neither are free nor fit under the bound (0: the
        pool can take them all; the rest must be released by whoever keeps them)."""
        return max(0, pages - self.free_pages - self._growable())

    def capacity(self) -> int | None:
        """The longest context the bound holds alone (every other page released): its
        pages plus one copied on write, beside the reserved page (None: no bound)."""
        return None if self.max_pages is None else context_capacity(self.max_pages, self.page)

    def bytes_to_hold(self, tokens: int) -> int:
        """The bound that holds a context of ``tokens`` tokens alone (its pages, one copied
        on write, the reserved page): the least ``max_bytes`` whose :meth:`capacity` is at
        least ``tokens``."""
        return (self.pages_holding(tokens) + 2) * self.page_bytes

    def trim(self) -> int:
        """Give the memory of the free pages above the highest page in use back to the OS
        (on the CPU, where the bound is reserved at once and pages become resident as they
        are written; elsewhere nothing): after a call that kept nothing, or a cleared cache,
        the pool's resident memory returns to what it holds. Returns the bytes advised."""
        top = self.touched - 1
        refs = self.refs
        while top > 0 and refs[top] == 0:
            top -= 1
        if top + 1 >= self.touched:
            return 0
        if self.layout.device.type != "cpu":  # no memory to give back: pages above it are free again
            self._free = [p for p in self._free if p <= top]
            self.touched = top + 1
            return 0
        P, hd = self.page, self.layout.head_dim
        size = self.storage.element_size()
        chunk = self.pages * P * hd  # elements of one (layer, key/value, head) block
        first, last = (top + 1) * P * hd, self.touched * P * hd
        base = self.storage.data_ptr()
        for block in range(self.storage.numel() // chunk):
            start = base + (block * chunk + first) * size
            drop_pages(start, start + (last - first) * size)
        freed = (self.touched - top - 1) * self.page_bytes
        self.touched = top + 1
        self._free = [p for p in self._free if p <= top]
        return freed

    def _growable(self) -> int:
        return (1 << 62) if self.max_pages is None else max(0, self.max_pages - self.pages)

    def _grow(self, past_bound: bool = False) -> bool:
        old = self.pages
        new = old * 2 if self.max_pages is None or past_bound else min(old * 2, self.max_pages)
        if new <= old:
            return False
        storage = self._new_storage(new)
        storage[:, :, :, : old * self.page].copy_(self.storage)
        self.storage = storage
        self.refs += [0] * (new - old)
        self.used += [0] * (new - old)
        self.grown += 1
        return True

    def incref(self, pages: Sequence[int]) -> None:
        refs = self.refs
        for p in pages:
            refs[p] += 1

    def decref(self, pages: Sequence[int]) -> None:
        refs = self.refs
        for p in pages:
            refs[p] -= 1
            if refs[p] == 0:
                self.used[p] = 0
                self._free.append(p)

    def copy_columns(self, src: int, dst: int, columns: int) -> None:
        """Columns ``[0, columns)`` of page ``src`` into page ``dst``."""
        P = self.page
        self.storage[:, :, :, dst * P : dst * P + columns].copy_(
            self.storage[:, :, :, src * P : src * P + columns]
        )
        self.used[dst] = columns
        self.copied_columns += columns

    def stats(self) -> dict[str, int]:
        return {
            "kv_pool_pages": self.pages,
            "kv_pool_pages_in_use": self.pages_in_use,
            "kv_pool_bytes": self.nbytes,
            "kv_pool_bytes_touched": self.touched * self.page_bytes,
            "kv_pool_bytes_in_use": self.pages_in_use * self.page_bytes,
            "kv_pool_grown": self.grown,
            "kv_pool_copied_columns": self.copied_columns,
        }


class KVSeq:
    """The KV of one context: ``pages`` hold its ``length`` columns in order (a reference
    on each). Release it once when it is no longer kept (:meth:`release`)."""

    __slots__ = ("pool", "pages", "length")

    def __init__(self, pool: KVPool, pages: list[int] | None = None, length: int = 0) -> None:
        self.pool = pool
        self.pages = pages if pages is not None else []
        self.length = length

    def fork(self, length: int | None = None) -> "KVSeq":
        """A context holding the first ``length`` columns (default: all) of this one: the
        same pages, one more reference on each."""
        n = self.length if length is None else length
        if not 0 <= n <= self.length:
            raise ValueError(f"fork({n}) of a context of {self.length} columns")
        pages = self.pages[: self.pool.pages_holding(n)]
        self.pool.incref(pages)
        return KVSeq(self.pool, list(pages), n)

    def extend(self, n: int) -> list[int]:
        """Room for ``n`` more columns: their slots, in order (pages taken as needed; a
        last page another context wrote past this one's end is copied first)."""
        pool, P = self.pool, self.pool.page
        slots: list[int] = []
        pos, end = self.length, self.length + n
        while pos < end:
            col = pos % P
            if col == 0:
                self.pages.append(pool.take())
            elif pool.used[self.pages[-1]] != col:  # another context wrote this page on
                fresh = pool.take()
                pool.copy_columns(self.pages[-1], fresh, col)
                pool.decref(self.pages[-1:])
                self.pages[-1] = fresh
            page = self.pages[-1]
            take = min(P - col, end - pos)
            base = page * P + col
            slots.extend(range(base, base + take))
            pool.used[page] = col + take
            pos += take
        self.length = end
        return slots

    def slots(self, start: int = 0, end: int | None = None) -> list[int]:
        """The slots of columns ``[start, end)``."""
        stop = self.length if end is None else end
        P, pages = self.pool.page, self.pages
        return [pages[i // P] * P + i % P for i in range(start, stop)]

    def contiguous_start(self, length: int) -> int | None:
        """The slot of column 0 when columns ``[0, length)`` lie at consecutive slots (their
        pages in order: a view of the pool reads them, no gather), else None."""
        pages = self.pages[: self.pool.pages_holding(length)]
        if all(pages[i] == pages[0] + i for i in range(len(pages))):
            return pages[0] * self.pool.page
        return None

    def shared_columns(self, others: Iterable["KVSeq"]) -> int:
        """How many first columns this context and every one of ``others`` hold at the same
        slots: those of the pages they all begin with, up to the shortest length."""
        pages, length = self.pages, self.length
        common = len(pages)
        for other in others:
            theirs = other.pages
            n = min(common, len(theirs))
            k = 0
            while k < n and theirs[k] == pages[k]:
                k += 1
            common = k
            length = min(length, other.length)
        return min(common * self.pool.page, length)

    def release(self) -> None:
        """Give back this context's references (idempotent)."""
        if self.pages:
            self.pool.decref(self.pages)
            self.pages = []
        self.length = 0

    def __repr__(self) -> str:
        return f"KVSeq(length={self.length}, pages={len(self.pages)})"
