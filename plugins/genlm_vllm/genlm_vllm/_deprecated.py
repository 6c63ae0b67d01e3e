"""What genlm-vllm keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_vllm.backend`` (a module path: this module answers for it, warning) and its
  names: ``VLLMBackend``, the backend class over :class:`~genlm_vllm.engine.VLLMEngine`
  (now ``genlm_core.load("vllm", ...)``, or ``BaseLogprobBackend(VLLMEngine(llm, config),
  config)`` around an ``LLM`` started by hand with :func:`genlm_vllm.launch.engine_kwargs`),
  and the names that live in :mod:`genlm_vllm.launch` (``INSTALL_HINT``,
  ``VLLMNotInstalledError``, ``engine_kwargs``, ``check_dtype``) and
  :mod:`genlm_vllm.lifecycle` (``EngineDiedError``), each read with a warning naming its module.

Light: nothing here is imported until a name is read (vLLM and torch come with them).
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

#: deprecated module path -> the module answering for it (read by genlm-core's import hook)
MOVED = {"genlm_vllm.backend": "genlm_vllm._deprecated"}
#: what to do instead, said when the old path is imported
ADVICE = {
    "genlm_vllm.backend": "load with genlm_core.load('vllm', ...); the engine is genlm_vllm.engine.VLLMEngine, "
    "the other names live in genlm_vllm.launch and genlm_vllm.lifecycle"
}

#: re-exported name -> the module that defines it (read with a warning naming it)
_ELSEWHERE = {
    "INSTALL_HINT": "genlm_vllm.launch",
    "VLLMNotInstalledError": "genlm_vllm.launch",
    "check_dtype": "genlm_vllm.launch",
    "engine_kwargs": "genlm_vllm.launch",
    "EngineDiedError": "genlm_vllm.lifecycle",
}


def __getattr__(name: str) -> Any:
    module = _ELSEWHERE.get(name)
    if module is not None:
        warnings.warn(
            f"genlm_vllm.backend.{name} is deprecated and will be removed in genlm-core {REMOVAL}: "
            f"import it from {module}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)
    if name in ("VLLMBackend", "VLLMEngine"):
        return _backend_names()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _backend_names() -> dict[str, Any]:
    from genlm_core.engine.backend import backend_class
    from genlm_vllm.engine import VLLMEngine

    return {
        "VLLMEngine": VLLMEngine,
        "VLLMBackend": backend_class("vllm", VLLMEngine, deprecated="genlm_vllm.VLLMBackend"),
    }
