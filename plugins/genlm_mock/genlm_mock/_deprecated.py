"""What genlm-mock keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_mock.backend`` (a module path: this module answers for it, warning) and its
  ``MockBackend``: the backend class over :class:`~genlm_mock.engine.MockEngine`, now
  ``genlm_core.load("mock", ...)``, or ``BaseLogprobBackend(MockEngine(...), config)`` around
  an engine built by hand.

Light: nothing here is imported until a name is read (genlm-core's
``old_backend``, :mod:`genlm_core._deprecated`, answers for the names).
"""

from __future__ import annotations

from genlm_core.engine import old_backend

__all__ = ["ADVICE", "MOVED", "REMOVAL"]

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

#: deprecated module path -> the module answering for it (read by genlm-core's import hook)
MOVED = {"genlm_mock.backend": "genlm_mock._deprecated"}
#: what to do instead, said when the old path is imported
ADVICE = {
    "genlm_mock.backend": "load with genlm_core.load('mock', ...); the engine is genlm_mock.engine.MockEngine"
}

__getattr__ = old_backend("mock", "genlm_mock.engine:MockEngine", "MockBackend", "genlm_mock.backend")
