"""Where an engine computes and in what dtype: decided once, before any engine is imported.

:func:`place` reads the config (``device``, ``dtype``: what was asked), the
:class:`~genlm_core.engine.checkpoint.Checkpoint` (what the model's files declare), the
devices this machine has for the backend (the registry's hardware probe: no torch) and the
engine's one default (its config class's ``default_dtype``), and returns a
:class:`Placement`:

* **device**: the one asked for (``config.requested_device()``), checked against the
  machine, else the best device present that the backend's registration runs on
  (CUDA, Apple silicon, CPU);
* **dtype**: the one asked for (``config.requested_dtype()``), else (``"auto"``,
  :func:`auto_dtype`) the dtype the checkpoint declares (:func:`declared_dtype`:
  ``config.json``'s ``dtype`` or ``torch_dtype``, at its top level or in its
  ``text_config``, else its safetensors weights; a GGUF's file type), else the config's
  ``default_dtype``. A model served elsewhere (``genlm serve``) is placed there: ``dtype``
  None unless asked. An explicit ``float32`` / ``float16`` / ``bfloat16`` is used as
  given: no engine substitutes another (engines disagree on what their own "auto" means:
  vLLM's runs a float32 checkpoint in bfloat16 on CPU, transformers keeps float32, so
  genlm-vllm passes the placed dtype to vLLM explicitly).

Then the engine class answers one question, :meth:`Engine.dtypes_on(device)
<genlm_core.engine.contract.Engine.dtypes_on>`, and :func:`refuse_unsupported` refuses a
dtype it cannot compute in there (:class:`UnsupportedDtypeError`, a ``ValueError`` naming
the dtype and the device), before anything loads. The engine loads with the placement
(``services.device``, ``services.dtype``); nothing checks it again. This is the one place
that decides a dtype: ``genlm doctor`` and the conformance kit ask :func:`auto_dtype` too.

Imports nothing heavy (the standard library and genlm_core's light modules).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genlm_core import _deprecated
from genlm_core.dtype_names import DTYPES, normalize_dtype
from genlm_core.errors import ConfigError
from genlm_core.model_files import checkpoint_file
from genlm_core.registry import hardware

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.config import BackendConfig
    from genlm_core.engine.checkpoint import Checkpoint

__all__ = [
    "DTYPES",
    "Placement",
    "UnsupportedDtypeError",
    "auto_dtype",
    "declared_dtype",
    "normalize_dtype",
    "place",
    "refuse_unsupported",
]

#: the spellings of a device: a kind, and for CUDA an optional index
_DEVICE = re.compile(r"^(cuda(:\d+)?|mps|cpu)$")
#: safetensors header dtype codes of floating tensors
_SAFETENSORS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}

#: genlm-core 0.1's names here (resolve_dtype, checkpoint_dtype): see genlm_core._deprecated
__getattr__ = _deprecated.old_names(__name__)


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


@dataclass(frozen=True)
class Placement:
    """Where the engine computes (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``) and in what
    dtype (``"float32"``, ``"float16"``, ``"bfloat16"``). None: not decided by the core (a
    model served elsewhere, an engine built by hand around a model it loaded itself): the
    engine's own ``device`` / ``dtype`` say it."""

    device: str | None = None
    dtype: str | None = None


def place(
    config: BackendConfig,
    checkpoint: Checkpoint,
    devices: Sequence[str] | None = None,
    name: str | None = None,
) -> Placement:
    """The placement of ``config``'s model (see the module). ``devices``: where the backend
    runs on this machine, best first (its registration's devices the hardware probe found;
    None: every device found)."""
    name = name or type(config).component or "backend"
    present = list(devices) if devices is not None else hardware.probe().devices
    device = _device(config.requested_device(), present, name)
    requested = config.requested_dtype()
    if checkpoint.kind == "served":  # the server decided it
        return Placement(device, None if requested == "auto" else requested)
    if requested != "auto":
        return Placement(device, requested)
    return Placement(device, auto_dtype(checkpoint, type(config).default_dtype))


def auto_dtype(checkpoint: Checkpoint, default: str | None = "float32") -> str | None:
    """What ``dtype="auto"`` places ``checkpoint`` in: the dtype its files declare, else
    ``default`` (the config class's ``default_dtype``; :func:`place` passes it)."""
    return _declared(checkpoint) or default


def _device(asked: str | None, present: Sequence[str], name: str) -> str:
    if asked is None:
        if not present:
            raise ConfigError(f"{name}: none of its devices is present on this machine")
        return present[0]
    asked = str(asked).strip()
    if not _DEVICE.match(asked):
        raise ConfigError(f"{name}: device={asked!r}: expected 'cuda', 'cuda:N', 'mps' or 'cpu'")
    kind = asked.split(":")[0]
    if kind not in present:
        probe = hardware.probe()
        why = (
            f"no CUDA device: {probe.cuda_reason}"
            if kind == "cuda"
            else f"this machine has {', '.join(probe.devices)}"
        )
        raise ConfigError(
            f"{name}: device={asked!r} is not available to this backend here ({why}); pass one of "
            f"{', '.join(repr(d) for d in present)} or leave device out"
        )
    return asked


def _declared(checkpoint: Checkpoint) -> str | None:
    """The dtype the checkpoint's own files declare (None: they say nothing)."""
    if checkpoint.kind == "gguf":
        return checkpoint.gguf.dtype() if checkpoint.gguf is not None else None
    if checkpoint.kind != "folder":
        return None
    folder = checkpoint_file(checkpoint.model, "config.json")
    return declared_dtype(
        checkpoint.config, folder.parent if folder else None, f"the checkpoint {checkpoint.model}"
    )


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


def refuse_unsupported(engine_class: type, placement: Placement, config: BackendConfig, name: str) -> None:
    """Ask ``engine_class`` its one question (:meth:`~genlm_core.engine.contract.Engine.dtypes_on`
    the placement's device) and raise :class:`UnsupportedDtypeError` for a dtype it cannot
    compute in there: before anything loads."""
    if placement.device is None or placement.dtype is None:
        return
    if getattr(engine_class, "supported_dtypes", None) is None:
        dtypes = engine_class.dtypes_on(placement.device)
    else:  # perhaps an engine of genlm-core 0.1's contract
        dtypes = _deprecated.dtypes_on(engine_class, placement.device, config)
    if dtypes is not None and placement.dtype not in dtypes:
        raise UnsupportedDtypeError(
            name,
            placement.dtype,
            placement.device,
            f"the engine computes in {', '.join(sorted(dtypes))} there",
        )
