"""The name a transformers model takes and returns its KV cache by.

transformers 5.24 renamed the forward's ``past_key_values`` argument (and the output's
field) to ``cache``. The old names still work there, through a shim that logs "
``past_key_values``/``cache_params`` are deprecated", and they go in 5.40, which
genlm-hf's pin (``transformers>=5.0,<6``) admits. Models before 5.24 (and remote code
written for them) know only ``past_key_values``. So the name is read from the model's
own forward signature, once per model, and a forward's output is read by whichever
field it holds.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["cache_kwarg", "output_cache"]

#: the forward argument's name, per model class (a signature read is ~50 us: not per step)
_KWARG: dict[type, str] = {}


def cache_kwarg(model: Any) -> str:
    """``"cache"`` when ``model``'s forward declares it (transformers >= 5.24), else
    ``"past_key_values"``."""
    cls = type(model)
    name = _KWARG.get(cls)
    if name is None:
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):  # a forward without a readable signature
            params = {}
        name = "cache" if "cache" in params else "past_key_values"
        _KWARG[cls] = name
    return name


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned: the output's ``cache`` (transformers >= 5.24) or
    ``past_key_values`` field, without the deprecated alias's warning; None when it holds
    neither (``use_cache=False``)."""
    for name in ("cache", "past_key_values"):
        if name in output:  # a ModelOutput is a mapping of its set fields
            return output[name]
    return None
