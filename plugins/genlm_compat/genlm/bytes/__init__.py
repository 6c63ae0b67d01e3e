"""genlm-bytes' API (``genlm.bytes``) on genlm-core's byte beam (genlm-compat)."""

from __future__ import annotations

from typing import Any

from genlm.backend._guard import warn_if_real
from genlm.backend._surface import module_getattr

from genlm_core.bytes import (
    EOS,
    EOT,
    LazyTrieState,
    StatefulTokenizedLM,
    TrieMode,
)
from genlm_core.bytes import BeamParams as _CoreBeamParams
from genlm_core.bytes import ByteBeamState as _CoreByteBeamState
from genlm_core.trie.async_trie import AsyncTokenByteTrie as AsyncTokenByteTrie
from genlm_core.trie.cpu import TokenByteTrie

warn_if_real("genlm-bytes", "genlm.bytes")
__getattr__, _ = module_getattr(__name__)  # Chart

__all__ = [
    "EOS",
    "EOT",
    "AsyncTokenByteTrie",
    "BeamParams",
    "ByteBeamState",
    "Chart",
    "LazyTrieState",
    "StatefulTokenizedLM",
    "TokenByteTrie",
    "TrieMode",
]

_POSITIONAL = ("K", "prune_threshold", "verbose", "eos_tokens", "heal", "heal_max_backoff", "heal_max_splits")


class BeamParams(_CoreBeamParams):
    """genlm-bytes' ``BeamParams(K, prune_threshold=0.0, verbose=False, eos_tokens=None,
    heal=True, heal_max_backoff=None, heal_max_splits=None)``, positional as there.
    ``eos_tokens`` (alias ``eos_byte_strings``) keeps genlm-bytes' meaning: ``None``
    means no EOS tokens (genlm-core's own ``BeamParams`` takes the backend's then)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(_POSITIONAL):
            raise TypeError(
                f"BeamParams takes at most {len(_POSITIONAL)} positional arguments ({len(args)} given)"
            )
        for name, value in zip(_POSITIONAL, args):
            if name in kwargs:
                raise TypeError(f"BeamParams got multiple values for argument {name!r}")
            kwargs[name] = value
        if "K" not in kwargs:
            raise TypeError("BeamParams missing required argument: 'K'")
        if "eos_tokens" in kwargs and "eos_byte_strings" in kwargs:
            raise TypeError("BeamParams: give eos_tokens or eos_byte_strings, not both")
        eos = kwargs.pop("eos_tokens", kwargs.pop("eos_byte_strings", None))
        # a lone str or bytes is one token (as in genlm-core), never split into characters
        super().__init__(eos_tokens=() if eos is None else eos, **kwargs)

    @property
    def eos_byte_strings(self) -> tuple[bytes, ...]:
        return self.eos_tokens or ()


class ByteBeamState(_CoreByteBeamState):
    """genlm-core's byte beam; ``initial(llm, params, trie_opts=None)`` as in genlm-bytes."""

    @classmethod
    async def initial(cls, llm: Any, params: Any, trie_opts: dict | None = None) -> Any:  # type: ignore[override]
        if trie_opts:
            raise ValueError(
                f"trie_opts={trie_opts!r}: genlm-core picks the trie by name, "
                "use BeamParams(..., trie='numpy' or 'torch') instead"
            )
        return await super().initial(llm, params)
