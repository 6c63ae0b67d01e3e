"""The names ``dtype`` takes on every backend and the spellings read as them.

Below the config, the registry and the engine package, which all name dtypes
(:mod:`genlm_core.engine.placement` reads them from checkpoints). Standard library only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DTYPES", "normalize_dtype"]

#: the values ``dtype`` accepts on every backend
DTYPES = ("auto", "float32", "float16", "bfloat16")

#: spellings found in config files and safetensors headers -> our names
_ALIASES = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "f32": "float32",
    "torch.float32": "float32",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "f16": "float16",
    "torch.float16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "torch.bfloat16": "bfloat16",
}


def normalize_dtype(value: Any) -> str | None:
    """Our name (``float32``/``float16``/``bfloat16``) for a dtype spelling, or None."""
    if value is None:
        return None
    return _ALIASES.get(str(value).strip().lower())
