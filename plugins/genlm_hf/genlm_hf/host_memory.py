"""Advice to the operating system about host memory genlm-hf holds (Linux; nothing elsewhere).

* :func:`drop_pages`: the pages of a range go back to the OS (``MADV_DONTNEED``): used on the
  dense weights of packed linear layers that lie in a mapped checkpoint file
  (:mod:`genlm_hf.cpu_linear`), whose pages the kernel would read again from the file.
* :func:`no_huge_pages`: a range is backed by small pages only (``MADV_NOHUGEPAGE``): the KV
  pool reserves its whole bound at once on the CPU and touches it page by page in many
  places (:mod:`genlm_hf.pool`); under transparent huge pages set to ``always`` each touch
  would make 2 MiB resident.

Only the pages wholly inside a range are advised.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["drop_pages", "no_huge_pages"]

_MADV_DONTNEED = 4
_MADV_NOHUGEPAGE = 15


def _advise(start: int, end: int, advice: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = -(-start // page) * page, end // page * page
    if last <= first:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), advice) == 0


def drop_pages(start: int, end: int) -> bool:
    """Give back the pages wholly inside ``[start, end)`` (only for memory whose contents the
    kernel can read again: an unmodified private file mapping)."""
    return _advise(start, end, _MADV_DONTNEED)


def no_huge_pages(start: int, end: int) -> bool:
    """Back ``[start, end)`` with small pages only."""
    return _advise(start, end, _MADV_NOHUGEPAGE)
