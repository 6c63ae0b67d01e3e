"""What genlm-hf keeps for old programs, and the release that removes it (genlm-hf 0.3).

* ``genlm_hf.HFBackend``: ``genlm_core.load("hf", ...)``, or
  ``BaseLogprobBackend(HFEngine(model, tokenizer, config), config)`` around a model
  loaded by hand.
* the options ``static_decode_bytes`` (the static buffers' bound: every KV column is in
  the pool now, bounded by ``kv_cache_bytes``) and ``fused_attention`` (the decode step
  attends over the pool): accepted, ignored, with a warning.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

__all__ = ["REMOVED_IN", "hf_backend_class", "warn_deprecated_options"]

#: the release that removes what this module keeps
REMOVED_IN = "genlm-hf 0.3"


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
                f"hf: {name} is deprecated and ignored ({why}); {REMOVED_IN} removes it",
                DeprecationWarning,
                stacklevel=4,
            )


@functools.cache
def hf_backend_class(engine_class: type) -> type:
    """``genlm_hf.HFBackend``: a backend class loading ``engine_class``
    (:class:`~genlm_hf.engine.HFEngine`; warns when made)."""
    from genlm_core.engine.backend import backend_class

    return backend_class("hf", engine_class, deprecated="genlm_hf.HFBackend")
