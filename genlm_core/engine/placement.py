"""Where an engine computes and in what dtype: decided once, before any engine is imported.

:func:`place` reads the config (``device``, ``dtype``: what was asked), the
:class:`~genlm_core.engine.checkpoint.Checkpoint` (what the model's files declare), the
devices this machine has for the backend (the registry's hardware probe: no torch) and the
engine's one default (its config class's ``default_dtype``), and returns a
:class:`Placement`:

* **device**: the one asked for (``config.requested_device()``), checked against the
  machine, else the best device present that the backend's registration runs on
  (CUDA, Apple silicon, CPU);
* **dtype**: the one asked for (``config.requested_dtype()``), else (``"auto"``) the dtype
  the checkpoint declares (:func:`genlm_core.engine.dtypes.declared_dtype`: ``config.json``,
  its safetensors weights, a GGUF's file type), else the config's ``default_dtype``. A
  model served elsewhere (``genlm serve``) is placed there: ``dtype`` None unless asked.

Then the engine class answers one question, :meth:`Engine.dtypes_on(device)
<genlm_core.engine.contract.Engine.dtypes_on>`, and :func:`refuse_unsupported` refuses a
dtype it cannot compute in there, before anything loads. The engine loads with the
placement (``services.device``, ``services.dtype``); nothing checks it again.

Imports nothing heavy (the standard library and genlm_core's light modules).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from genlm_core.engine.dtypes import UnsupportedDtypeError, declared_dtype
from genlm_core.engine.model_folder import checkpoint_file
from genlm_core.errors import ConfigError
from genlm_core.registry import hardware

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.config import BackendConfig
    from genlm_core.engine.checkpoint import Checkpoint

__all__ = ["Placement", "place", "refuse_unsupported"]

#: the spellings of a device: a kind, and for CUDA an optional index
_DEVICE = re.compile(r"^(cuda(:\d+)?|mps|cpu)$")


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
    return Placement(device, _declared(checkpoint) or type(config).default_dtype)


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


def refuse_unsupported(engine_class: type, placement: Placement, config: BackendConfig, name: str) -> None:
    """Ask ``engine_class`` its one question (:meth:`~genlm_core.engine.contract.Engine.dtypes_on`
    the placement's device) and raise :class:`UnsupportedDtypeError` for a dtype it cannot
    compute in there: before anything loads."""
    if placement.device is None or placement.dtype is None:
        return
    from genlm_core import _deprecated

    dtypes = _deprecated.dtypes_on(engine_class, placement.device, config)
    if dtypes is not None and placement.dtype not in dtypes:
        raise UnsupportedDtypeError(
            name,
            placement.dtype,
            placement.device,
            f"the engine computes in {', '.join(sorted(dtypes))} there",
        )
