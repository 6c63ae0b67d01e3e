"""What genlm-llamacpp keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_llamacpp.backend`` (a module path: this module answers for it, warning) and its
  ``LlamaCppBackend``: the backend class over :class:`~genlm_llamacpp.engine.LlamaCppEngine`, now
  ``genlm_core.load("llamacpp", ...)``, or ``BaseLogprobBackend(LlamaCppEngine(...), config)`` around an
  engine built by hand.

Light: nothing here is imported until a name is read (genlm-core's
``old_backend``, :mod:`genlm_core._deprecated`, answers for the names).
"""

from __future__ import annotations

from genlm_core.engine import old_backend

__all__ = ["ADVICE", "MOVED", "REMOVAL"]

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

#: deprecated module path -> the module answering for it (read by genlm-core's import hook)
MOVED = {"genlm_llamacpp.backend": "genlm_llamacpp._deprecated"}
#: what to do instead, said when the old path is imported
ADVICE = {
    "genlm_llamacpp.backend": "load with genlm_core.load('llamacpp', ...); the engine is genlm_llamacpp.engine.LlamaCppEngine"
}

__getattr__ = old_backend(
    "llamacpp", "genlm_llamacpp.engine:LlamaCppEngine", "LlamaCppBackend", "genlm_llamacpp.backend"
)
