"""What a registration is: one implementation of a protocol kind, named by an import string.

* :class:`Registration` - a name, an import string (``"module:attr"``, fsspec style:
  nothing is imported until the implementation is loaded), the devices it runs on
  and its priority on each, the modules it needs (checked with
  ``importlib.util.find_spec``, never imported) and the command that installs them.
* :class:`BrokenPlugin` - a plugin that failed to import or to register, listed
  with status ``broken`` instead of breaking the others.
* The registry's errors, each naming the implementation and the fix.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from genlm_core.registry import hardware

__all__ = [
    "FIRST_PARTY",
    "BrokenPlugin",
    "PluginError",
    "Registration",
    "UnavailableImplementationError",
    "UnknownImplementationError",
    "core_version",
    "import_string",
]

#: First-party backend names and the distribution that provides each (the one list the
#: registry's messages, the tests and scripts/gen_config_docs.py read)
FIRST_PARTY: dict[str, str] = {
    "hf": "genlm-hf",
    "vllm": "genlm-vllm",
    "mlx": "genlm-mlx",
    "llamacpp": "genlm-llamacpp",
    "mock": "genlm-mock",
    "remote": "genlm-remote",
}


class PluginError(RuntimeError):
    """A plugin failed to load or register (raised only in strict mode)."""


class UnknownImplementationError(ValueError):
    """No implementation is registered under that name."""


class UnavailableImplementationError(RuntimeError):
    """The implementation is registered but cannot run here (engine or device missing)."""


def core_version() -> str:
    try:
        return md.version("genlm-core")
    except md.PackageNotFoundError:
        return "unknown"


@dataclass
class Registration:
    """One registered implementation of a protocol kind."""

    kind: str
    name: str
    target: str
    config: Any = None
    devices: tuple[str, ...] = ("cpu",)
    priority: dict[str, int] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    install: str | None = None
    auto: bool = True
    description: str = ""
    #: the model formats it reads (:mod:`genlm_core.registry.model_formats`): ``("gguf",)``,
    #: ``("hf-folder", "hub-id")``; ``()``: it loads no model (no checkpoint); ``None``: not declared
    #: (a candidate for every model). ``load("auto", model=...)`` skips those that cannot read it
    model_formats: tuple[str, ...] | None = None
    plugin: str = ""
    distribution: str = ""
    version: str = ""

    # ------------------------------------------------------------------ status
    def missing_modules(self) -> list[str]:
        missing = []
        for mod in self.requires:
            try:
                if importlib.util.find_spec(mod) is None:
                    missing.append(mod)
            except (ImportError, ValueError):
                missing.append(mod)
        return missing

    def supported_devices(self) -> list[str]:
        present = hardware.probe().devices
        return [d for d in present if d in self.devices]

    def status(self) -> tuple[str, str]:
        """``("available", "")`` or ``("unavailable", why)``."""
        missing = self.missing_modules()
        if missing:
            hint = f"; install with `{self.install}`" if self.install else ""
            return "unavailable", f"engine not installed: {', '.join(missing)}{hint}"
        if not self.supported_devices():
            return "unavailable", (
                f"no supported device: needs {', '.join(self.devices)}, "
                f"found {', '.join(hardware.probe().devices)}"
            )
        return "available", ""

    def reads(self, formats: frozenset[str] | None) -> bool:
        """Whether it can read a model in one of ``formats`` (``None``: no model given, each
        backend's default). An undeclared registration is assumed to read anything."""
        if formats is None or self.model_formats is None:
            return True
        return bool(formats.intersection(self.model_formats))

    def priority_on(self, device: str) -> int:
        return int(self.priority.get(device, 0))

    # ------------------------------------------------------------------ loading
    def load_target(self) -> Any:
        return import_string(self.target, self)

    def load_config_class(self) -> Any:
        if self.config is None:
            cls = self.load_target()
            return getattr(cls, "config_class", None)
        if isinstance(self.config, str):
            return import_string(self.config, self)
        return self.config

    def as_dict(self) -> dict[str, Any]:
        status, reason = self.status()
        return {
            "name": self.name,
            "kind": self.kind,
            "aliases": list(self.aliases),
            "distribution": self.distribution,
            "version": self.version,
            "plugin": self.plugin,
            "target": self.target,
            "devices": list(self.devices),
            "priority": dict(self.priority),
            "status": status,
            "reason": reason,
            "description": self.description,
            "model_formats": None if self.model_formats is None else list(self.model_formats),
        }


@dataclass
class BrokenPlugin:
    """A plugin that failed to import or to register."""

    plugin: str
    distribution: str
    version: str
    error: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.plugin,
            "kind": "plugin",
            "aliases": [],
            "distribution": self.distribution,
            "version": self.version,
            "plugin": self.plugin,
            "target": "",
            "devices": [],
            "priority": {},
            "status": "broken",
            "reason": self.error,
            "description": "",
        }


def import_string(target: str, reg: Registration | None = None) -> Any:
    module, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
        return obj
    except ImportError as exc:
        where = f" for {reg.kind} {reg.name!r}" if reg else ""
        hint = f" Install it with `{reg.install}`." if reg and reg.install else ""
        raise UnavailableImplementationError(f"Cannot import {target!r}{where}: {exc}.{hint}") from exc
