"""Token-byte tries: the probability mass under every byte prefix of a vocabulary.

Implementations (all share :class:`~genlm_core.trie.structure.TrieStructure`, so
node numbers agree across them):

* ``"numpy"``: :class:`genlm_core.trie.cpu.TokenByteTrie` (numba kernels when
  numba is installed, vectorised NumPy otherwise);
* ``"torch"``: :class:`genlm_core.trie.torch_impl.TorchTokenByteTrie` (CUDA or CPU,
  results stay on the device).

:class:`AsyncTokenByteTrie` batches concurrent ``await weight_sum(...)`` calls.
Nothing heavy is imported here: torch is only imported by the torch trie.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from genlm_core.trie.structure import EOS, EOT, EOSMode, TrieMode, TrieStructure

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.trie.async_trie import AsyncTokenByteTrie
    from genlm_core.trie.base import NonFiniteWeightsError
    from genlm_core.trie.cpu import TokenByteTrie
    from genlm_core.trie.torch_impl import TorchTokenByteTrie

__all__ = [
    "EOS",
    "EOT",
    "EOSMode",
    "TrieMode",
    "TrieStructure",
    "TRIE_IMPLEMENTATIONS",
    "TokenByteTrie",
    "TorchTokenByteTrie",
    "AsyncTokenByteTrie",
    "NonFiniteWeightsError",
    "make_trie",
    "load_trie_class",
]

_LAZY = {
    "TokenByteTrie": "genlm_core.trie.cpu",
    "TorchTokenByteTrie": "genlm_core.trie.torch_impl",
    "AsyncTokenByteTrie": "genlm_core.trie.async_trie",
    "NonFiniteWeightsError": "genlm_core.trie.base",
}


def __getattr__(name: str) -> Any:
    if name == "TRIE_IMPLEMENTATIONS":
        return _implementations()
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'genlm_core.trie' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)


def _implementations() -> dict[str, tuple[str, list[str]]]:
    """``TRIE_IMPLEMENTATIONS``: name -> (import string, devices), read from the registry
    (the tries registered through ``genlm_register_tries``, the core's and plugins')."""
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
