"""Module paths from before the core was grouped by audience keep working.

genlm-core 0.1 had every module at the top level (``genlm_core.backend``,
``genlm_core.embedded``, ...); they now live in ``engine/``, ``registry/``, ``models/``
and ``tools/``. Code that imports an old path gets the module itself (the same
object, so ``isinstance`` checks, monkeypatching and pickles keep working), not a
copy: :class:`MovedModuleFinder` answers only for the names in :data:`MOVED`, imports
the new module and puts it in ``sys.modules`` under the old name too.
``python -m genlm_core.cli`` (an old path) still runs the command line.

New code imports the new paths; this table is never extended.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

#: old module path -> where it lives now
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


class MovedModuleLoader(importlib.abc.Loader):
    """Loads an old path as the module at its new path."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder the import system discards (see exec_module)

    def exec_module(self, module: ModuleType) -> None:
        # The import system returns whatever sys.modules holds under the old name once
        # this returns: the real module, whose own __spec__ and __name__ stay untouched.
        sys.modules[module.__name__] = importlib.import_module(self.target)

    def get_code(self, fullname: str) -> CodeType | None:
        """For ``python -m OLD.PATH``: runpy runs the new module's code as ``__main__``."""
        spec = importlib.util.find_spec(self.target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "get_code"):
            return None
        return spec.loader.get_code(self.target)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers for the old paths in :data:`MOVED` and for nothing else."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, MovedModuleLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
