"""What genlm-remote keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_remote.backend`` (a module path: this module answers for it, warning) and its
  ``RemoteBackend``: the backend class over :class:`~genlm_remote.engine.RemoteEngine`, now
  ``genlm_core.load("remote", url=...)``.

Light: nothing here is imported until a name is read (genlm-core's
``old_backend``, :mod:`genlm_core._deprecated`, answers for the names).
"""

from __future__ import annotations

from genlm_core.engine import old_backend

__all__ = ["ADVICE", "MOVED", "REMOVAL"]

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

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
