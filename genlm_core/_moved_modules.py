"""Deprecated module paths (genlm-core 0.1's top-level ``genlm_core.backend``,
``genlm_core.embedded``, ...) answered by the modules in ``engine/``, ``registry/``,
``models/`` and ``tools/``, until genlm-core :data:`REMOVAL`.

Code that imports a path of :data:`MOVED` gets a ``DeprecationWarning`` naming the
path to import instead and the version that removes the old one, and the module
itself (the same object, so ``isinstance`` checks, monkeypatching and pickles keep
working), not a copy: :class:`MovedModuleFinder` answers only for those names, imports
the module and puts it in ``sys.modules`` under the deprecated name too.
``python -m genlm_core.cli`` still runs the command line.

New code imports the modules where they are; this table is never extended.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

#: the genlm-core version that removes the paths of :data:`MOVED`
REMOVAL = "0.3"

#: deprecated module path -> the module to import instead
MOVED: dict[str, str] = {
    **{
        f"genlm_core.{name}": f"genlm_core.engine.{name}"
        for name in (
            "backend",
            "batching",
            "caches",
            "checkpoint",
            "dtypes",
            "kv_reuse",
            "lora",
            "memory",
            "model_folder",
            "prefix_cache",
            "progress",
            "row_transport",
            "validation",
            "vocab",
        )
    },
    "genlm_core.hookspecs": "genlm_core.registry.hookspecs",
    "genlm_core.hardware": "genlm_core.registry.hardware",
    "genlm_core.builtins": "genlm_core.registry.core_plugin",
    "genlm_core.distributions": "genlm_core.registry.distributions",
    "genlm_core.embedded": "genlm_core.models",
    "genlm_core.cli": "genlm_core.tools.cli",
    "genlm_core.cli_options": "genlm_core.tools.cli_options",
    "genlm_core.demo": "genlm_core.tools.demo",
    "genlm_core.compare": "genlm_core.tools.compare",
    "genlm_core.smc": "genlm_core.tools.sis",
}


def warn_moved(old: str) -> None:
    """The ``DeprecationWarning`` of importing ``old`` (a key of :data:`MOVED`)."""
    warnings.warn(
        f"{old} is deprecated and will be removed in genlm-core {REMOVAL}: import {MOVED[old]}",
        DeprecationWarning,
        stacklevel=3,
    )


class MovedModuleLoader(importlib.abc.Loader):
    """Loads a deprecated path as the module at its current path."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder the import system discards (see exec_module)

    def exec_module(self, module: ModuleType) -> None:
        # The import system returns whatever sys.modules holds under the deprecated name once
        # this returns: the real module, whose own __spec__ and __name__ stay untouched.
        warn_moved(module.__name__)
        sys.modules[module.__name__] = importlib.import_module(self.target)

    def get_code(self, fullname: str) -> CodeType | None:
        """For ``python -m OLD.PATH``: runpy runs the module's code as ``__main__``."""
        warn_moved(fullname)
        spec = importlib.util.find_spec(self.target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "get_code"):
            return None
        return spec.loader.get_code(self.target)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers for the deprecated paths in :data:`MOVED` and for nothing else."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, MovedModuleLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
