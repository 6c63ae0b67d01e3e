"""What genlm-llamacpp keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_llamacpp.backend`` (a module path: this module answers for it, warning) and its
  ``LlamaCppBackend``: the backend class over :class:`~genlm_llamacpp.engine.LlamaCppEngine`, now
  ``genlm_core.load("llamacpp", ...)``, or ``BaseLogprobBackend(LlamaCppEngine(...), config)`` around an
  engine built by hand.

Light: nothing here is imported until a name is read.
"""

from __future__ import annotations

import functools
from typing import Any

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

#: deprecated module path -> the module answering for it (read by genlm-core's import hook)
MOVED = {"genlm_llamacpp.backend": "genlm_llamacpp._deprecated"}
#: what to do instead, said when the old path is imported
ADVICE = {
    "genlm_llamacpp.backend": "load with genlm_core.load('llamacpp', ...); the engine is genlm_llamacpp.engine.LlamaCppEngine"
}

#: the names it answers for, built on first use (the engine module imports its engine)
_NAMES = ("LlamaCppBackend", "LlamaCppEngine")


@functools.cache
def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from genlm_llamacpp.engine import LlamaCppEngine

    if name == "LlamaCppEngine":
        return LlamaCppEngine
    from genlm_core.engine.backend import backend_class

    return backend_class("llamacpp", LlamaCppEngine, deprecated="genlm_llamacpp.LlamaCppBackend")
