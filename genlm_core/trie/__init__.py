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

#: name -> (import string "module:Class", devices it runs on, best first)
TRIE_IMPLEMENTATIONS: dict[str, tuple[str, list[str]]] = {
    "numpy": ("genlm_core.trie.cpu:TokenByteTrie", ["cpu"]),
    "torch": ("genlm_core.trie.torch_impl:TorchTokenByteTrie", ["cuda", "cpu"]),
}

_LAZY = {
    "TokenByteTrie": "genlm_core.trie.cpu",
    "TorchTokenByteTrie": "genlm_core.trie.torch_impl",
    "AsyncTokenByteTrie": "genlm_core.trie.async_trie",
    "NonFiniteWeightsError": "genlm_core.trie.base",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'genlm_core.trie' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)


def load_trie_class(name: str) -> type:
    """The class registered under ``name`` in :data:`TRIE_IMPLEMENTATIONS`."""
    try:
        target, _ = TRIE_IMPLEMENTATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown trie implementation {name!r}; known: {sorted(TRIE_IMPLEMENTATIONS)}"
        ) from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _cuda_available() -> bool:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def make_trie(vocab: Any, device: str = "auto", **kwargs: Any) -> Any:
    """Build a trie for ``vocab`` on the best implementation for ``device``.

    ``device="auto"``: the torch trie on CUDA when a GPU is visible, else the NumPy
    trie. ``"cpu"``: NumPy. ``"cuda"``/``"cuda:N"``: torch on that device. Other
    keyword arguments (``eos_tokens``, ``atomic_tokens``, ...) go to the constructor,
    which names unknown ones. Both take ``weight_sum(ws, mode, *, out=None,
    lazy=False)`` (the torch trie computes eagerly under ``lazy=True``).
    """
    if device == "auto":
        device = "cuda" if _cuda_available() else "cpu"
    if device == "cpu":
        return load_trie_class("numpy")(vocab, **kwargs)
    return load_trie_class("torch")(vocab, device=device, **kwargs)
