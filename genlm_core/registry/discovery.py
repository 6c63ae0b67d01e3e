"""Plugin discovery and resolution: the process-wide :class:`Registry`.

* Discovery: every entry point in the ``genlm_core`` group names a plugin module
  implementing the hooks of :mod:`genlm_core.registry.hookspecs`. Each plugin is loaded
  and called on its own: a plugin that fails to import or to register is reported
  (a warning naming plugin, version and core version; status ``broken`` in
  :func:`genlm_core.list_backends`) and the others keep working.
  ``GENLM_STRICT_PLUGINS=1`` makes such failures raise.
* ``GENLM_PLUGINS`` (comma-separated entry-point or distribution names) is an
  allow list; ``GENLM_DISABLE_PLUGINS`` a deny list.
* Registrations (:mod:`genlm_core.registry.entries`) are import strings: nothing heavy
  is imported until an implementation is loaded. Availability is checked with
  ``importlib.util.find_spec`` and the cheap probes of :mod:`genlm_core.registry.hardware`.
* Resolution by name, by alias, or by hardware (``"auto"``).
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import os
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import pluggy

from genlm_core.registry import hardware
from genlm_core.registry.entries import (
    FIRST_PARTY,
    BrokenPlugin,
    PluginError,
    Registration,
    UnavailableImplementationError,
    UnknownImplementationError,
    core_version,
)
from genlm_core.registry.hookspecs import ENTRY_POINT_GROUP, HOOK_KINDS, PROJECT, GenlmHookSpecs
from genlm_core.registry.model_formats import describe, install_hint, model_formats

__all__ = ["Registry", "get_registry"]


def _env_list(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return {x.strip() for x in raw.split(",") if x.strip()}


def _strict() -> bool:
    return os.environ.get("GENLM_STRICT_PLUGINS", "").lower() in ("1", "true", "yes")


class Registry:
    """All registered implementations, by kind and name."""

    def __init__(self) -> None:
        self._by_kind: dict[str, dict[str, Registration]] = {k: {} for k in HOOK_KINDS.values()}
        self._aliases: dict[str, dict[str, str]] = {k: {} for k in HOOK_KINDS.values()}
        self.broken: list[BrokenPlugin] = []
        self.plugins: dict[str, tuple[str, str]] = {}
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(GenlmHookSpecs)

    # ------------------------------------------------------------------ discovery
    def discover(self) -> None:
        """Register the core's built-ins, then every entry-point plugin."""
        from genlm_core.registry import core_plugin

        self._add_plugin(core_plugin, "core", "genlm-core", core_version())
        allow = _env_list("GENLM_PLUGINS")
        deny = _env_list("GENLM_DISABLE_PLUGINS") or set()
        eps = sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
        seen: set[str] = set()
        for ep in eps:
            dist = ep.dist.name if ep.dist is not None else "unknown"
            version = ep.dist.version if ep.dist is not None else "unknown"
            if ep.name in seen:
                continue
            seen.add(ep.name)
            if allow is not None and ep.name not in allow and dist not in allow:
                continue
            if ep.name in deny or dist in deny:
                continue
            try:
                module = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the rest
                self._report_broken(ep.name, dist, version, f"import failed: {type(exc).__name__}: {exc}")
                continue
            self._add_plugin(module, ep.name, dist, version)
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self._report_broken(getattr(exc, "plugin", "?"), "?", "?", f"unknown hook: {exc}")

    def _add_plugin(self, module: Any, name: str, dist: str, version: str) -> None:
        try:
            self.pm.register(module, name=name)
        except Exception as exc:  # noqa: BLE001
            self._report_broken(name, dist, version, f"invalid hooks: {type(exc).__name__}: {exc}")
            return
        self.plugins[name] = (dist, version)
        for hook_name, kind in HOOK_KINDS.items():
            impls = [i for i in getattr(self.pm.hook, hook_name).get_hookimpls() if i.plugin_name == name]
            for impl in impls:
                register = self._make_register(kind, name, dist, version)
                try:
                    impl.function(register=register)
                except Exception as exc:  # noqa: BLE001
                    self._report_broken(
                        name, dist, version, f"{hook_name} failed: {type(exc).__name__}: {exc}"
                    )

    def doctor_sections(self, hardware: Any) -> dict[str, dict[str, Any]]:
        """Every plugin's ``genlm_doctor`` section, by plugin name; a plugin whose hook
        fails gets a section saying so (the others are still shown)."""
        out: dict[str, dict[str, Any]] = {}
        for impl in self.pm.hook.genlm_doctor.get_hookimpls():
            try:
                section = impl.function(hardware=hardware)
            except Exception as exc:  # noqa: BLE001 - one plugin's doctor must not hide the others
                section = {"title": impl.plugin_name, "lines": [f"genlm_doctor failed: {exc}"], "data": {}}
            if section:
                out[impl.plugin_name] = {
                    "title": str(section.get("title", impl.plugin_name)),
                    "lines": [str(x) for x in section.get("lines", [])],
                    "data": section.get("data", {}),
                }
        return out

    def _report_broken(self, plugin: str, dist: str, version: str, error: str) -> None:
        msg = (
            f"genlm-core plugin {plugin!r} ({dist} {version}) is broken and was skipped: {error} "
            f"[genlm-core {core_version()}]. Other backends keep working; set "
            f"GENLM_STRICT_PLUGINS=1 to make this an error, or GENLM_DISABLE_PLUGINS={plugin} to hide it."
        )
        if _strict():
            raise PluginError(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        self.broken.append(BrokenPlugin(plugin, dist, version, error))

    def _make_register(self, kind: str, plugin: str, dist: str, version: str):
        def register(
            name: str,
            target: str,
            *,
            config: Any = None,
            devices: list[str] | tuple[str, ...] = ("cpu",),
            priority: dict[str, int] | int | None = None,
            aliases: list[str] | tuple[str, ...] = (),
            requires: list[str] | tuple[str, ...] = (),
            install: str | None = None,
            auto: bool = True,
            description: str = "",
            model_formats: list[str] | tuple[str, ...] | None = None,
        ) -> None:
            if not isinstance(target, str) or ":" not in target:
                raise ValueError(
                    f"register({name!r}, {target!r}): target must be an import string 'module:attr'"
                )
            if isinstance(model_formats, str):
                raise ValueError(
                    f"register({name!r}, ...): model_formats must be a list of format names, "
                    f"e.g. [{model_formats!r}], not a string"
                )
            if isinstance(priority, int):
                priority = {d: priority for d in devices}
            reg = Registration(
                kind=kind,
                name=name,
                target=target,
                config=config,
                devices=tuple(devices),
                priority=dict(priority or {}),
                aliases=tuple(aliases),
                requires=tuple(requires),
                install=install,
                auto=auto,
                description=description,
                model_formats=None if model_formats is None else tuple(f.lower() for f in model_formats),
                plugin=plugin,
                distribution=dist,
                version=version,
            )
            existing = self._by_kind[kind].get(name)
            if existing is not None and existing.plugin != plugin:
                warnings.warn(
                    f"{kind} {name!r} from plugin {plugin!r} replaces the one from {existing.plugin!r}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self._by_kind[kind][name] = reg
            for alias in aliases:
                self._aliases[kind][alias] = name

        return register

    # ------------------------------------------------------------------ queries
    def all(self, kind: str | None = None) -> list[Registration]:
        kinds = [kind] if kind else list(self._by_kind)
        return [r for k in kinds for r in self._by_kind[k].values()]

    def names(self, kind: str) -> list[str]:
        return sorted(self._by_kind[kind])

    def get(self, kind: str, name: str) -> Registration:
        """The registration called ``name`` (or an alias of it); helpful errors otherwise."""
        if kind not in self._by_kind:
            raise ValueError(f"Unknown protocol kind {kind!r}; kinds: {', '.join(self._by_kind)}")
        table = self._by_kind[kind]
        real = self._aliases[kind].get(name, name)
        if real in table:
            return table[real]
        installed = sorted(table)
        if kind == "backend" and name in FIRST_PARTY:
            raise UnknownImplementationError(
                f"Backend {name!r} is provided by the {FIRST_PARTY[name]} plugin, which is not "
                f"installed. Install it with `pip install {FIRST_PARTY[name]}`. "
                f"Installed backends: {', '.join(installed) or 'none'}."
            )
        broken = [b for b in self.broken if b.plugin == name]
        if broken:
            raise UnknownImplementationError(f"{kind} {name!r}: its plugin is broken ({broken[0].error}).")
        candidates = installed + list(self._aliases[kind])
        close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownImplementationError(
            f"Unknown {kind} {name!r}.{hint} Installed: {', '.join(installed) or 'none'}. "
            f"First-party backends: {', '.join(f'{k} ({v})' for k, v in FIRST_PARTY.items())}."
        )

    def choose_auto(
        self, kind: str = "backend", model: Any = None, devices: Sequence[str] | None = None
    ) -> tuple[Registration, str, list[dict[str, Any]]]:
        """Pick the best available implementation for this machine (and ``model``).

        Implementations that cannot read ``model`` (their declared ``model_formats``, see
        :mod:`~genlm_core.registry.model_formats`: an HF folder, a hub id, a GGUF file) are
        skipped. Devices are tried best first (CUDA, Apple silicon, CPU); on the first
        device some available implementation supports, the highest priority wins (ties
        go to the name, for a stable choice). Returns the choice, its device and the
        candidates considered (for ``genlm doctor``; a skipped one has status
        ``"skipped"``). ``devices`` replaces this machine's device list (best first),
        e.g. ``["cpu"]`` for the best implementation on the CPU.
        """
        considered: list[dict[str, Any]] = []
        every = [r for r in self._by_kind[kind].values() if r.auto]
        formats = model_formats(model) if kind == "backend" else None
        regs = [r for r in every if r.reads(formats)]
        for reg in every:
            if not reg.reads(formats):
                considered.append(
                    {
                        "device": None,
                        "name": reg.name,
                        "priority": None,
                        "status": "skipped",
                        "reason": f"reads {', '.join(reg.model_formats or ()) or 'no model'}, "
                        f"not {' or '.join(describe(f) for f in sorted(formats or ()))}",
                    }
                )
        for device in devices if devices is not None else hardware.probe().devices:
            ranked = []
            for reg in regs:
                if device not in reg.devices:
                    continue
                status, reason = reg.status()
                considered.append(
                    {
                        "device": device,
                        "name": reg.name,
                        "priority": reg.priority_on(device),
                        "status": status,
                        "reason": reason,
                    }
                )
                if status == "available":
                    ranked.append((reg.priority_on(device), reg.name, reg))
            if ranked:
                ranked.sort(key=lambda x: (-x[0], x[1]))
                return ranked[0][2], device, considered
        if formats is not None and every and not regs:
            raise UnavailableImplementationError(_nothing_reads(kind, model, formats, every))
        if formats is not None and regs:
            raise UnavailableImplementationError(
                f"No {kind} that reads {' or '.join(describe(f) for f in sorted(formats))} can run here: "
                + "; ".join(f"{r.name}: {r.status()[1] or 'no supported device'}" for r in regs)
            )
        if devices is not None:
            raise UnavailableImplementationError(
                f"No {kind} can run on device {', '.join(devices)}; `genlm backends --all` lists "
                "each implementation's devices"
            )
        raise UnavailableImplementationError(
            f"No {kind} can run on this machine (devices: {', '.join(hardware.probe().devices)}). "
            "Install one, e.g. `pip install genlm-hf`; `genlm backends` shows why each is unavailable."
        )


def _nothing_reads(kind: str, model: Any, formats: frozenset[str], installed: list[Registration]) -> str:
    """The error for a model that no installed implementation reads: what to install for
    it, and what the installed ones read instead."""
    what = " or ".join(describe(f) for f in sorted(formats))
    hints = sorted({h for f in formats if (h := install_hint(f))})
    fix = [f"install a backend that reads it (`{' or '.join(hints)}`)"] if hints else []
    readable = sorted({f for r in installed for f in (r.model_formats or ())})
    if readable:
        fix.append(f"give {' or '.join(describe(f) for f in readable)}, which the installed backends read")
    names = ", ".join(
        f"{r.name} ({', '.join(r.model_formats) if r.model_formats else 'no model'})" for r in installed
    )
    return (
        f"load(model={os.fspath(model)!r}): that is {what}, and no installed {kind} reads it "
        f"(installed: {names or 'none'}). Fix: {'; or '.join(fix) or 'install a backend that reads it'}."
    )


_registry: Registry | None = None
_lock = threading.Lock()


def get_registry(refresh: bool = False) -> Registry:
    """The process-wide registry, discovered on first use."""
    global _registry
    with _lock:
        if _registry is None or refresh:
            reg = Registry()
            reg.discover()
            _registry = reg
        return _registry
