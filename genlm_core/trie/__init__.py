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

from genlm_core import _deprecated
from genlm_core.trie.factory import load_trie_class, make_trie, trie_implementations
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
    "TokenByteTrie",
    "TorchTokenByteTrie",
    "AsyncTokenByteTrie",
    "NonFiniteWeightsError",
    "make_trie",
    "load_trie_class",
    "trie_implementations",
]

_LAZY = {
    "TokenByteTrie": "genlm_core.trie.cpu",
    "TorchTokenByteTrie": "genlm_core.trie.torch_impl",
    "AsyncTokenByteTrie": "genlm_core.trie.async_trie",
    "NonFiniteWeightsError": "genlm_core.trie.base",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:  # an old name (genlm_core._deprecated), else an AttributeError
        return _deprecated.old_name(__name__, name)
    return getattr(importlib.import_module(mod), name)
