"""What genlm-mlx keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_mlx.backend`` (a module path: this module answers for it, warning) and its
  ``MLXBackend``: the backend class over :class:`~genlm_mlx.engine.MLXEngine`, now
  ``genlm_core.load("mlx", ...)``, or ``BaseLogprobBackend(MLXEngine(...), config)`` around an
  engine built by hand.

Light: nothing here is imported until a name is read.
"""

from __future__ import annotations

import functools
from typing import Any

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

#: deprecated module path -> the module answering for it (read by genlm-core's import hook)
MOVED = {"genlm_mlx.backend": "genlm_mlx._deprecated"}
#: what to do instead, said when the old path is imported
ADVICE = {
    "genlm_mlx.backend": "load with genlm_core.load('mlx', ...); the engine is genlm_mlx.engine.MLXEngine"
}

#: the names it answers for, built on first use (the engine module imports its engine)
_NAMES = ("MLXBackend", "MLXEngine")


@functools.cache
def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from genlm_mlx.engine import MLXEngine

    if name == "MLXEngine":
        return MLXEngine
    from genlm_core.engine.backend import backend_class

    return backend_class("mlx", MLXEngine, deprecated="genlm_mlx.MLXBackend")
