"""What genlm-hf keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_hf.HFBackend`` (and ``genlm_hf.backend.HFBackend``): the backend class over
  :class:`~genlm_hf.backend.HFEngine`, now ``genlm_core.load("hf", ...)``, or
  ``BaseLogprobBackend(HFEngine(model, tokenizer, config), config)`` around a model loaded
  by hand.
* ``genlm_hf.backend`` (once the engine lives in ``genlm_hf/engine.py``): this module
  answers for the old path, warning.

Light: nothing here is imported until a name is read.
"""

from __future__ import annotations

import functools
from typing import Any

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

#: deprecated module path -> the module answering for it (read by genlm-core's import hook,
#: which is asked only for a path no file answers)
MOVED = {"genlm_hf.backend": "genlm_hf._deprecated"}
#: what to do instead, said when the old path is imported
ADVICE = {"genlm_hf.backend": "load with genlm_core.load('hf', ...); the engine is genlm_hf.HFEngine"}

#: the names it answers for, built on first use (the engine module imports its engine)
_NAMES = ("HFBackend", "HFEngine")


@functools.cache
def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from genlm_hf.backend import HFEngine

    if name == "HFEngine":
        return HFEngine
    from genlm_core.engine.backend import backend_class

    return backend_class("hf", HFEngine, deprecated="genlm_hf.HFBackend")
