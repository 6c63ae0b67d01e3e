"""genlm-core: a plugin-based backend for language-model probabilistic programs.

Importing this package imports no engine (torch, transformers, vllm, mlx).
"""

from genlm_core.api import (
    backend_config,
    explain_auto,
    list_backends,
    list_implementations,
    load,
    load_trie,
    resolve,
)
from genlm_core.batching import AutoBatcher, BatcherClosed
from genlm_core.config import BackendConfig, ConfigError, GenlmConfig
from genlm_core.hookspecs import hookimpl
from genlm_core.protocols import ByteModel, Cache, LogprobBackend, Trie
from genlm_core.registry import UnavailableImplementationError, UnknownImplementationError, get_registry
from genlm_core.token import Token


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
    "load_trie",
    "resolve",
]
