"""genlm-core: a plugin-based backend for language-model probabilistic programs.

Importing this package imports no engine (torch, transformers, vllm, mlx).

The package, by audience (docs/architecture.md has the picture):

* users: this module (``load``, ``list_backends``, ``load_trie``, ...), ``config``,
  ``protocols``, ``token``, ``trie/``, ``bytes/``, ``models/`` and ``tools/`` (the
  ``genlm`` command);
* plugin authors: ``engine/`` (one import point: ``genlm_core.engine``) and
  ``registry/`` (hooks, discovery, hardware probes); ``testing/`` is their test kit;
* many programs on one engine: ``serve/`` (``genlm serve``).
"""

from genlm_core import _deprecated
from genlm_core.api import (
    backend_config,
    explain_auto,
    list_backends,
    list_implementations,
    load,
    load_byte_model,
    load_trie,
    resolve,
)
from genlm_core.config import BackendConfig, ConfigError, GenlmConfig
from genlm_core.engine.batching import AutoBatcher, BatcherClosed
from genlm_core.protocols import ByteModel, Cache, LogprobBackend, Trie
from genlm_core.registry import UnavailableImplementationError, UnknownImplementationError, get_registry
from genlm_core.registry.hookspecs import hookimpl
from genlm_core.token import Token

_deprecated.install()  # the module paths of older releases keep working, warning


def _version() -> str:
    """The installed distribution's version: pyproject.toml is its one source."""
    import importlib.metadata

    try:
        return importlib.metadata.version("genlm-core")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "0+unknown"


__version__ = _version()

__all__ = [
    "AutoBatcher",
    "BackendConfig",
    "BatcherClosed",
    "ByteModel",
    "Cache",
    "ConfigError",
    "GenlmConfig",
    "LogprobBackend",
    "Token",
    "Trie",
    "UnavailableImplementationError",
    "UnknownImplementationError",
    "backend_config",
    "explain_auto",
    "get_registry",
    "hookimpl",
    "list_backends",
    "list_implementations",
    "load",
    "load_byte_model",
    "load_trie",
    "resolve",
]
