"""The engine contract and what an engine plugin builds on, with one import point.

A backend plugin writes an :class:`Engine` (``forward`` over distinct contexts, or
``forward_rows`` over rows resuming from kept KV; an optional sampler) that loads from the
:class:`Checkpoint` the core read, with the :class:`EngineServices` the core hands it (a
frozen value: the config, the :class:`Placement`, the backend's name); the core's
:class:`BaseLogprobBackend` holds it and does everything else::

    from genlm_core.engine import BackendConfig, Engine, KVCacheOptions, KVPolicy, ResumeRow, RowsOut

The modules, one mechanism each, shared by every backend:

=================  ======================================================================
``contract``       :class:`Engine`: what a plugin writes; :class:`SampleRequest`
``services``       :class:`EngineServices`: what the core hands an engine at load
``placement``      :class:`Placement`: device and dtype, decided once before the engine loads;
                   the one meaning of ``dtype`` on every engine
``backend``        :class:`BaseLogprobBackend`: holds an engine; validation, batching,
                   caching, normalisation, sampling, the context limit, EOS ids
``sampling``       tokens drawn from the rows, for an engine without a sampler
``burst``          an SMC decode loop run in the backend, a control drawing each step
``batching``       :class:`AutoBatcher`: concurrent calls become one batch
``validation``     token-id contexts checked before they join a batch
``contexts``       :data:`Context`, and distinct contexts run in batches (one helper)
``decode_batches`` a burst's rows kept in the engine's batch layout between its steps
``resident``       which context of an ordinary call continues which live engine row
``row_checks``     engine rows no caller may read (NaN, no finite score): one check
``caches``         :class:`OutputCache`: next-token rows by whole context, LRU, bounded;
                   a backend's output cache resolved by name
``prefix_cache``   :class:`PrefixCache`: opaque engine KV per token prefix
``kv_rows``        :class:`KVPolicy`, :class:`ResumeRow`, :class:`RowsOut`: what passes between
                   the core and an engine that resumes from kept KV
``kv_calls``       the core's side of KV reuse: lookups, rounds (``call_plan``), room, keeping
``kv_reuse``       the core's prefix cache of engine payloads, its owners and counters;
                   :class:`KVCacheOptions`
``memory``         what a value keeps alive, private copies for callers
``checkpoint``     one checkpoint policy, read once into a :class:`Checkpoint`
``gguf_metadata``  the key/value header of a GGUF file (context length, EOS id, dtype)
``vocab``          exact byte vocabularies of tokenizers
``lora``           the bookkeeping of LoRA adapters
``progress``       status notes, progress bars, engines' repeated log lines summarised
``row_transport``  float32 rows through ``/dev/shm`` across processes
=================  ======================================================================

Where a model is (local folders vs hub ids, checked before any engine loads) is
:mod:`genlm_core.model_files`, below the config and the registry; its names are exported
here too.

A plugin keeps the names of its older releases in its own ``_deprecated`` module, with
the core's helpers (``old_backend``, ``old_names``, ``moved_names``,
``renamed_property``; :mod:`genlm_core._deprecated` says how).

Names are resolved on first use (PEP 562), so importing this package imports none of
its modules, and none of them imports an engine at module level except
``row_transport`` (torch), which is loaded only when one of its names is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: name -> the module that defines it
EXPORTS: dict[str, str] = {
    # the surface every backend shares
    "BaseLogprobBackend": "genlm_core.engine.backend",
    "backend_class": "genlm_core.engine.backend",
    "Engine": "genlm_core.engine.contract",
    "SampleRequest": "genlm_core.engine.contract",
    "EngineServices": "genlm_core.engine.services",
    "Placement": "genlm_core.engine.placement",
    "place": "genlm_core.engine.placement",
    "EngineControl": "genlm_core.engine.burst",
    "BurstReport": "genlm_core.engine.burst",
    "BackendConfig": "genlm_core.config",
    "GenlmConfig": "genlm_core.config",
    "ConfigError": "genlm_core.errors",
    "LogprobBackend": "genlm_core.protocols",
    "LoraBackend": "genlm_core.protocols",
    "Token": "genlm_core.token",
    "hookimpl": "genlm_core.registry.hookspecs",
    # what a plugin's _deprecated module keeps old names with (genlm_core._deprecated)
    "moved_names": "genlm_core._deprecated",
    "old_backend": "genlm_core._deprecated",
    "old_names": "genlm_core._deprecated",
    "renamed_property": "genlm_core._deprecated",
    # batching and validation
    "AutoBatcher": "genlm_core.engine.batching",
    "BatcherClosed": "genlm_core.engine.batching",
    "BatcherStats": "genlm_core.engine.batching",
    "validate_context": "genlm_core.engine.validation",
    "Context": "genlm_core.engine.contexts",
    "run_distinct": "genlm_core.engine.contexts",
    "EngineOutputError": "genlm_core.engine.row_checks",
    # caches and KV reuse
    "OutputCache": "genlm_core.engine.caches",
    "OutputCacheConfig": "genlm_core.engine.caches",
    "output_cache_for": "genlm_core.engine.caches",
    "PrefixCache": "genlm_core.engine.prefix_cache",
    "KVPolicy": "genlm_core.engine.kv_rows",
    "ResumeRow": "genlm_core.engine.kv_rows",
    "RowsOut": "genlm_core.engine.kv_rows",
    "KVCacheOptions": "genlm_core.engine.kv_reuse",
    "sizeof": "genlm_core.engine.memory",
    "private_copy": "genlm_core.engine.memory",
    "compact": "genlm_core.engine.memory",
    # checkpoints, folders, dtypes
    "Checkpoint": "genlm_core.engine.checkpoint",
    "read_checkpoint": "genlm_core.engine.checkpoint",
    "resolve_gguf": "genlm_core.engine.checkpoint",
    "read_config": "genlm_core.engine.checkpoint",
    "read_generation_config": "genlm_core.engine.checkpoint",
    "context_limit": "genlm_core.engine.checkpoint",
    "engine_context_limit": "genlm_core.engine.checkpoint",
    "default_eos_ids": "genlm_core.engine.checkpoint",
    "checkpoint_eos_ids": "genlm_core.engine.checkpoint",
    "default_model": "genlm_core.engine.checkpoint",
    "as_model_argument": "genlm_core.model_files",
    "check_model_folder": "genlm_core.model_files",
    "checkpoint_file": "genlm_core.model_files",
    "looks_like_path": "genlm_core.model_files",
    "DTYPES": "genlm_core.dtype_names",
    "normalize_dtype": "genlm_core.dtype_names",
    "UnsupportedDtypeError": "genlm_core.engine.placement",
    "auto_dtype": "genlm_core.engine.placement",
    "GGUFMetadata": "genlm_core.engine.gguf_metadata",
    "read_gguf_metadata": "genlm_core.engine.gguf_metadata",
    # vocabularies, adapters, progress, transport
    "DecodedVocab": "genlm_core.engine.vocab",
    "decode_vocab": "genlm_core.engine.vocab",
    "decode_vocab_info": "genlm_core.engine.vocab",
    "LoraAdapters": "genlm_core.engine.lora",
    "note": "genlm_core.engine.progress",
    "progress_bar": "genlm_core.engine.progress",
    "summarise_repeats": "genlm_core.engine.progress",
    "RowBuffer": "genlm_core.engine.row_transport",
    "shm_available": "genlm_core.engine.row_transport",
    "stack_rows": "genlm_core.engine.row_transport",
    "write_rows": "genlm_core.engine.row_transport",
}

__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    module = EXPORTS.get(name)
    if module is None:  # an old name (genlm_core._deprecated), else an AttributeError
        from genlm_core import _deprecated

        return _deprecated.old_name(__name__, name)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(EXPORTS))


if TYPE_CHECKING:  # what type checkers and IDEs see; never run
    from genlm_core._deprecated import moved_names, old_backend, old_names, renamed_property
    from genlm_core.config import BackendConfig, GenlmConfig
    from genlm_core.dtype_names import DTYPES, normalize_dtype
    from genlm_core.engine.backend import BaseLogprobBackend, backend_class
    from genlm_core.engine.batching import AutoBatcher, BatcherClosed, BatcherStats
    from genlm_core.engine.burst import BurstReport, EngineControl
    from genlm_core.engine.caches import OutputCache, OutputCacheConfig, output_cache_for
    from genlm_core.engine.checkpoint import (
        Checkpoint,
        checkpoint_eos_ids,
        context_limit,
        default_eos_ids,
        default_model,
        engine_context_limit,
        read_checkpoint,
        read_config,
        read_generation_config,
        resolve_gguf,
    )
    from genlm_core.engine.contexts import Context, run_distinct
    from genlm_core.engine.contract import Engine, SampleRequest
    from genlm_core.engine.gguf_metadata import GGUFMetadata, read_gguf_metadata
    from genlm_core.engine.kv_reuse import KVCacheOptions
    from genlm_core.engine.kv_rows import KVPolicy, ResumeRow, RowsOut
    from genlm_core.engine.lora import LoraAdapters
    from genlm_core.engine.memory import compact, private_copy, sizeof
    from genlm_core.engine.placement import Placement, UnsupportedDtypeError, auto_dtype, place
    from genlm_core.engine.prefix_cache import PrefixCache
    from genlm_core.engine.progress import note, progress_bar, summarise_repeats
    from genlm_core.engine.row_checks import EngineOutputError
    from genlm_core.engine.row_transport import RowBuffer, shm_available, stack_rows, write_rows
    from genlm_core.engine.services import EngineServices
    from genlm_core.engine.validation import validate_context
    from genlm_core.engine.vocab import DecodedVocab, decode_vocab, decode_vocab_info
    from genlm_core.errors import ConfigError
    from genlm_core.model_files import as_model_argument, check_model_folder, checkpoint_file, looks_like_path
    from genlm_core.protocols import LogprobBackend, LoraBackend
    from genlm_core.registry.hookspecs import hookimpl
    from genlm_core.token import Token
