"""What genlm-remote keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_remote.backend`` (a module path: this module answers for it, warning; the
  engine lives in :mod:`genlm_remote.engine`) and its ``RemoteBackend``: the backend class
  over :class:`~genlm_remote.engine.RemoteEngine`, now ``genlm_core.load("remote", url=...)``.

Light: nothing here is imported until a name is read.
"""

from __future__ import annotations

import functools
from typing import Any

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

#: deprecated module path -> the module answering for it (read by genlm-core's import hook)
MOVED = {"genlm_remote.backend": "genlm_remote._deprecated"}
#: what to do instead, said when the old path is imported
ADVICE = {
    "genlm_remote.backend": "load with genlm_core.load('remote', url=...); the engine is "
    "genlm_remote.engine.RemoteEngine"
}

#: the names it answers for, built on first use (the engine module imports its engine)
_NAMES = ("RemoteBackend", "RemoteEngine")


@functools.cache
def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from genlm_remote.engine import RemoteEngine

    if name == "RemoteEngine":
        return RemoteEngine
    from genlm_core.engine.backend import backend_class

    return backend_class("remote", RemoteEngine, deprecated="genlm_remote.RemoteBackend")
