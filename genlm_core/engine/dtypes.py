"""One meaning of ``dtype`` on every backend (import-light: no torch, no engine).

``dtype="auto"`` means the checkpoint's own dtype on every engine: the ``dtype``
(transformers 5) or ``torch_dtype`` (older) entry of its ``config.json`` (or of its
``text_config``), else the dtype its safetensors weights are stored in, else
float32 (a checkpoint that says nothing, e.g. a GGUF file, which transformers
dequantises to float32). An explicit ``float32`` / ``float16`` / ``bfloat16`` is
used as given. A backend that cannot compute in the resolved dtype on its device
raises :class:`UnsupportedDtypeError` (a ``ValueError`` naming the dtype and the
device); none substitutes another dtype.

This matters because engines disagree on what "auto" means: vLLM's own "auto" runs
a float32 checkpoint in bfloat16 on CPU (and float16/bfloat16 on GPUs), while
transformers keeps float32; genlm-vllm therefore passes the resolved dtype to vLLM
explicitly.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from genlm_core.dtype_names import DTYPES, normalize_dtype
from genlm_core.model_files import checkpoint_file

__all__ = [
    "DTYPES",
    "UnsupportedDtypeError",
    "checkpoint_dtype",
    "declared_dtype",
    "normalize_dtype",
    "resolve_dtype",
]

#: safetensors header dtype codes of floating tensors
_SAFETENSORS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class UnsupportedDtypeError(ValueError):
    """The requested dtype cannot run on this backend's device."""

    def __init__(self, backend: str, dtype: str, device: str, why: str = "") -> None:
        detail = f" ({why})" if why else ""
        super().__init__(
            f"{backend}: dtype={dtype!r} cannot run on device {device!r}{detail}; "
            f"pass another dtype (one of {', '.join(DTYPES[1:])}) or run on another device"
        )
        self.dtype = dtype
        self.device = device


def checkpoint_dtype(model: str | Path | None) -> str | None:
    """The dtype the checkpoint at ``model`` declares (``None`` if it says nothing here).

    Reads ``config.json`` of a local folder (or of a hub id already in the local
    Hugging Face cache; nothing is downloaded) and :func:`declared_dtype` answers.
    """
    if model is None:
        return None
    config_path = checkpoint_file(model, "config.json")
    if config_path is None:
        return None
    try:
        data = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return None
    return declared_dtype(data if isinstance(data, dict) else {}, config_path.parent, str(model))


def declared_dtype(
    config: Mapping[str, Any], folder: Path | None, where: str = "the checkpoint"
) -> str | None:
    """The dtype a ``config.json`` mapping declares: ``dtype``, then ``torch_dtype``, at
    the top level or in ``text_config``; without one, the dtype of the floating tensors
    of the first safetensors file in ``folder``. Raises ``ValueError`` for a declared
    dtype outside :data:`DTYPES` (e.g. float8): pass ``dtype=`` explicitly then."""
    for section in (config, config.get("text_config") or {}):
        for key in ("dtype", "torch_dtype"):
            raw = section.get(key) if isinstance(section, Mapping) else None
            if raw is None:
                continue
            name = normalize_dtype(raw)
            if name is None:
                raise ValueError(
                    f"{where} declares {key}={raw!r}, which dtype='auto' cannot "
                    f"run; pass dtype= explicitly (one of {', '.join(DTYPES[1:])})"
                )
            return name
    return _safetensors_dtype(folder) if folder is not None else None


def resolve_dtype(requested: str, model: str | Path | None) -> str:
    """``requested`` itself, or for ``"auto"`` the checkpoint's dtype (float32 if unknown)."""
    if requested not in DTYPES:
        raise ValueError(f"dtype={requested!r} is not one of {', '.join(DTYPES)}")
    if requested != "auto":
        return requested
    return checkpoint_dtype(model) or "float32"


def _safetensors_dtype(folder: Path) -> str | None:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    try:
        with open(files[0], "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error):
        return None
    for name, entry in header.items():
        if name != "__metadata__" and isinstance(entry, dict) and entry.get("dtype") in _SAFETENSORS:
            return _SAFETENSORS[entry["dtype"]]
    return None
