"""Deprecated: ``VLLMBackend`` and the names re-exported here (genlm-core 0.3 removes them).

A plugin registers its engine, :class:`~genlm_vllm.engine.VLLMEngine` (LoRA adapters are
its capability ``"lora"``); ``genlm_core.load("vllm", ...)`` builds the backend, and
``BaseLogprobBackend(VLLMEngine(llm, config), config)`` holds an engine around an ``LLM``
started by hand with :func:`genlm_vllm.launch.engine_kwargs`. The other names live in
:mod:`genlm_vllm.launch` (``INSTALL_HINT``, ``VLLMNotInstalledError``, ``engine_kwargs``,
``check_dtype``) and :mod:`genlm_vllm.lifecycle` (``EngineDiedError``); read from here,
they warn.
"""

from __future__ import annotations

import warnings
from typing import Any

from genlm_core.engine.backend import backend_class
from genlm_vllm.engine import VLLMEngine

#: re-exported name -> the module that defines it (read through ``__getattr__``, warning)
_MOVED = {
    "INSTALL_HINT": "genlm_vllm.launch",
    "VLLMNotInstalledError": "genlm_vllm.launch",
    "check_dtype": "genlm_vllm.launch",
    "engine_kwargs": "genlm_vllm.launch",
    "EngineDiedError": "genlm_vllm.lifecycle",
}

__all__ = ["VLLMBackend", *_MOVED]

VLLMBackend = backend_class("vllm", VLLMEngine, deprecated="genlm_vllm.VLLMBackend")


def __getattr__(name: str) -> Any:
    """The re-exported names, with a deprecation warning naming their module."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    warnings.warn(
        f"genlm_vllm.backend.{name} is deprecated and will be removed in genlm-core 0.3: "
        f"import it from {module}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)
