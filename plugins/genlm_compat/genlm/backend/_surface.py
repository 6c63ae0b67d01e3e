"""The rest of genlm-backend 0.3.1's and genlm-bytes 0.2.0's public modules.

Each submodule there (``genlm.backend.cache``, ``genlm.bytes.util``, ...) exists here
too and resolves its names (:data:`SURFACE`) on first use through :data:`TARGETS`: ``"module:attr"`` is the
genlm-compat or genlm-core object; any other text names the genlm-core equivalent of
a name that has none of the same shape. Such a name imports fine (a program that only
imports it keeps working) and raises on use with that text.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

_STATE = "genlm_core.bytes.LazyTrieState / ByteBeamState (the byte LM state of genlm-core)"
_VOCAB = "genlm_core.engine.vocab.decode_vocab(tokenizer) (verified by round trips; raises ValueError naming the tokenizer)"

#: where each name resolves, whichever module it is imported from
TARGETS: dict[str, str] = {
    **{n: f"genlm.backend.llm:{n}" for n in "AsyncLM AsyncMlxLM AsyncSGLTransformer AsyncTransformer "
       "AsyncVirtualLM MockAsyncLM".split()},
    **{n: f"genlm.backend.tokenization:{n}" for n in ("Token", "decode_vocab")},
    **{n: f"genlm.backend.trie:{n}" for n in "AsyncTokenCharacterTrie ParallelTokenCharacterTrie "
       "TokenCharacterTrie".split()},
    **{n: f"genlm.bytes:{n}" for n in "AsyncTokenByteTrie BeamParams ByteBeamState LazyTrieState "
       "StatefulTokenizedLM TokenByteTrie TrieMode".split()},
    "ByteVocabError": "builtins:ValueError", "ByteDecoderError": "builtins:ValueError",
    "OutputCache": "genlm.backend.cache:OutputCache", "TokenTrie": "genlm.backend.cache:TokenTrie",
    "Query": "genlm_hf.HFBackend (its batcher forms the queries)",
    **{n: f"genlm.backend.llm.futures:{n}" for n in ("BatchAbandoned", "batch_abandoned", "fail_futures")},
    **{n: f"genlm.backend.tokenization:{n}" for n in ("get_byte_vocab", "bytes_to_strs")},
    "check_byte_decoder": _VOCAB, "get_byte_tokens_from_byte_decoder": _VOCAB, "get_byte_tokens_from_sp": _VOCAB,
    **{n: f"genlm.bytes.util:{n}" for n in "Chart LazyByteProbs logsumexp escape format_byte format_table".split()},
    "StatefulByteLM": _STATE, "TokenHealer": "genlm_core.bytes:TokenHealer", "TrieOp": "genlm.bytes.trie:TrieOp",
}  # fmt: skip

#: the names of each submodule (as genlm-backend 0.3.1 / genlm-bytes 0.2.0 have them)
SURFACE: dict[str, list[str]] = {
    f"genlm.{module}": names.split()
    for module, names in {
        "backend.llm.base": "AsyncLM BatchAbandoned MockAsyncLM batch_abandoned decode_vocab fail_futures",
        "backend.llm.hf": "AsyncLM AsyncTransformer Query TokenTrie",
        "backend.llm.mlx": "AsyncLM AsyncMlxLM OutputCache batch_abandoned fail_futures",
        "backend.llm.sgl": "AsyncLM AsyncSGLTransformer OutputCache",
        "backend.llm.vllm": "AsyncLM AsyncVirtualLM",
        "backend.tokenization.bytes": "ByteDecoderError ByteVocabError check_byte_decoder "
        "get_byte_tokens_from_byte_decoder get_byte_tokens_from_sp get_byte_vocab",
        "backend.tokenization.token": "Token",
        "backend.trie.async_impl": "AsyncTokenCharacterTrie ParallelTokenCharacterTrie TokenCharacterTrie",
        "backend.trie.base": "Token TokenCharacterTrie",
        "backend.trie.parallel": "ParallelTokenCharacterTrie TokenCharacterTrie",
        "bytes.byte_lm": "BeamParams ByteBeamState LazyTrieState StatefulTokenizedLM",
        "bytes.byte_lm.beam": "AsyncTokenByteTrie BeamParams ByteBeamState LazyByteProbs LazyTrieState "
        "StatefulByteLM TokenHealer TrieMode logsumexp",
        "bytes.byte_lm.heal": "LazyTrieState TokenHealer format_byte",
        "bytes.byte_lm.lm_state": "StatefulByteLM StatefulTokenizedLM escape",
        "bytes.byte_lm.trie_state": "LazyByteProbs LazyTrieState StatefulTokenizedLM TrieMode escape",
    }.items()
}


class Unported(type):
    """A name with no genlm-core counterpart of the same shape: calling it, or reading
    any attribute of it, raises ``error`` with the genlm-core equivalent."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise cls.error(cls.hint)

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise cls.error(cls.hint)


def placeholder(
    module: str, name: str, equivalent: str, error: type[Exception] = NotImplementedError, hint: str = ""
) -> Any:
    hint = (
        hint or f"{module}.{name} (genlm-backend / genlm-bytes) is not part of genlm-compat; use {equivalent}"
    )
    return Unported(name, (), {"__module__": module, "hint": hint, "error": error})


@functools.cache
def resolve(module: str, name: str) -> Any:
    target = TARGETS[name]
    if " " in target or ":" not in target:
        return placeholder(module, name, target)
    where, _, attr = target.partition(":")
    return getattr(importlib.import_module(where), attr)


def module_getattr(module: str) -> tuple[Callable[[str], Any], list[str]]:
    """``(__getattr__, __all__)`` of one of the submodules in :data:`SURFACE`."""

    def __getattr__(name: str) -> Any:
        if name not in SURFACE[module]:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return resolve(module, name)

    return __getattr__, sorted(SURFACE[module])


def public_dir(module: str) -> Callable[[], list[str]]:
    """A module's ``__dir__``: its ``__all__`` and its public submodules, as the reference
    modules list them, not the helpers and typing names it imports to do its work."""

    def __dir__() -> list[str]:
        mod = sys.modules[module]
        names = set(getattr(mod, "__all__", ()))
        names |= {
            n
            for n, v in vars(mod).items()
            if isinstance(v, ModuleType) and v.__name__ == f"{module}.{n}" and not n.startswith("_")
        }
        return sorted(names)

    return __dir__
