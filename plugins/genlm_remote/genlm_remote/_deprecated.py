"""What genlm-remote keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_remote.backend`` (a module path: this module answers for it, warning) and its
  ``RemoteBackend``: the backend class over :class:`~genlm_remote.engine.RemoteEngine`, now
  ``genlm_core.load("remote", url=...)``.

Light: nothing here is imported until a name is read (genlm-core's
:func:`~genlm_core._deprecated.old_backend` answers for the names).
"""

from __future__ import annotations

from genlm_core._deprecated import REMOVAL, old_backend

__all__ = ["ADVICE", "MOVED", "REMOVAL"]

#: deprecated module path -> the module answering for it (read by genlm-core's import hook)
MOVED = {"genlm_remote.backend": "genlm_remote._deprecated"}
#: what to do instead, said when the old path is imported
ADVICE = {
    "genlm_remote.backend": "load with genlm_core.load('remote', url=...); the engine is "
    "genlm_remote.engine.RemoteEngine"
}

__getattr__ = old_backend(
    "remote", "genlm_remote.engine:RemoteEngine", "RemoteBackend", "genlm_remote.backend"
)
