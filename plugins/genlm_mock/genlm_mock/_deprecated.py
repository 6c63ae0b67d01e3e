"""What genlm-mock keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_mock.backend`` (a module path: this module answers for it, warning) and its
  ``MockBackend``: the backend class over :class:`~genlm_mock.engine.MockEngine`, now
  ``genlm_core.load("mock", ...)``, or ``BaseLogprobBackend(MockEngine(...), config)`` around
  an engine built by hand.

Light: nothing here is imported until a name is read.
"""

from __future__ import annotations

import functools
from typing import Any

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

#: deprecated module path -> the module answering for it (read by genlm-core's import hook)
MOVED = {"genlm_mock.backend": "genlm_mock._deprecated"}
#: what to do instead, said when the old path is imported
ADVICE = {
    "genlm_mock.backend": "load with genlm_core.load('mock', ...); the engine is genlm_mock.engine.MockEngine"
}

#: the names it answers for, built on first use (the engine module imports its engine)
_NAMES = ("MockBackend", "MockEngine")


@functools.cache
def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from genlm_mock.engine import MockEngine

    if name == "MockEngine":
        return MockEngine
    from genlm_core.engine.backend import backend_class

    return backend_class("mock", MockEngine, deprecated="genlm_mock.MockBackend")
