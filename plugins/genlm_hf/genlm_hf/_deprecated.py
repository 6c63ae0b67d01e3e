"""What genlm-hf keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_hf.HFBackend``: the backend class over :class:`~genlm_hf.engine.HFEngine`, now
  ``genlm_core.load("hf", ...)``, or ``BaseLogprobBackend(HFEngine(model, tokenizer,
  config), config)`` around a model loaded by hand.
* ``genlm_hf.backend`` (the engine lives in ``genlm_hf/engine.py``): genlm-core's import
  hook answers for the old path with the package (its ``HFEngine``, ``HFBackend``), warning.
* the options ``static_decode_bytes`` (the static buffers' bound: every KV column is in the
  pool now, bounded by ``kv_cache_bytes``) and ``fused_attention`` (the decode step attends
  over the pool): accepted, ignored, with a warning.

Light: it imports nothing of genlm-hf's.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

__all__ = ["ADVICE", "MOVED", "REMOVAL", "hf_backend_class", "warn_deprecated_options"]

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

#: deprecated module path -> the module answering for it (read by genlm-core's import hook,
#: which is asked only for a path no file answers)
MOVED = {"genlm_hf.backend": "genlm_hf"}
#: what to do instead, said when the old path is imported
ADVICE = {"genlm_hf.backend": "load with genlm_core.load('hf', ...); the engine is genlm_hf.HFEngine"}


def warn_deprecated_options(config: Any) -> None:
    """Warn for each deprecated option a config sets."""
    for name, why in (
        (
            "static_decode_bytes",
            "kv_cache_bytes bounds every KV column (the decode step keeps none of its own)",
        ),
        ("fused_attention", "the decode step attends over the KV pool"),
    ):
        if getattr(config, name, None) is not None:
            warnings.warn(
                f"hf: {name} is deprecated and ignored ({why}); genlm-core {REMOVAL} removes it",
                DeprecationWarning,
                stacklevel=4,
            )


@functools.cache
def hf_backend_class(engine_class: type) -> type:
    """``genlm_hf.HFBackend``: a backend class loading ``engine_class``
    (:class:`~genlm_hf.engine.HFEngine`; warns when made)."""
    from genlm_core.engine.backend import backend_class

    return backend_class("hf", engine_class, deprecated="genlm_hf.HFBackend")
