"""Tries by name and by device, through the registry (``genlm_register_tries``)."""

from __future__ import annotations

from typing import Any

__all__ = ["load_trie_class", "make_trie", "trie_implementations"]


def trie_implementations() -> dict[str, tuple[str, list[str]]]:
    """Name -> (import string, devices) of every registered trie, the core's and plugins'
    (read from the registry at each call)."""
    from genlm_core.registry import get_registry

    return {r.name: (r.target, list(r.devices)) for r in get_registry().all("trie")}


def load_trie_class(name: str) -> type:
    """The trie class registered under ``name`` (``"numpy"``, ``"torch"``, a plugin's)."""
    from genlm_core.registry import get_registry

    return get_registry().get("trie", name).load_target()


def make_trie(vocab: Any, device: str = "auto", **kwargs: Any) -> Any:
    """Build a trie for ``vocab`` on the best implementation for ``device``: the same
    resolution as :func:`genlm_core.load_trie` (the registry's).

    ``device="auto"``: the best implementation on this machine's best device (the torch
    trie on CUDA, the NumPy/numba trie otherwise). ``"cpu"``: the CPU trie.
    ``"cuda"``/``"cuda:N"``: the torch trie on that device. Other keyword arguments
    (``eos_tokens``, ``atomic_tokens``, ...) go to the constructor, which names unknown
    ones. Every trie takes ``weight_sum(ws, mode, *, out=None, lazy=False)`` and its
    results answer ``m[node]``, ``m.take(nodes)`` and ``np.asarray(m)``.
    """
    from genlm_core.api import load_trie

    return load_trie(vocab, "auto", device=device, **kwargs)
