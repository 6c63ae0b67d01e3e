"""What genlm-core keeps for code written against older releases, until genlm-core :data:`REMOVAL`.

Everything here warns (``DeprecationWarning``) naming what to use instead; new code
uses none of it, and this file is never extended with new mechanisms:

* **Moved module paths** (genlm-core 0.1's top-level ``genlm_core.backend``,
  ``genlm_core.embedded``, ...; a plugin's ``genlm_mock.backend``, ...): importing one
  gives the module at its new path, the same object (``isinstance`` checks,
  monkeypatching and pickles keep working), not a copy. :class:`MovedModuleFinder`
  reads the ``MOVED`` table of the ``_deprecated`` module of the path's package (this
  module's :data:`MOVED` for genlm-core; each genlm plugin keeps its own) and answers for
  those names only, after every other finder failed. ``python -m genlm_core.cli`` still
  runs the command line.
* **The engine's attributes read through the backend** (``llm.weights_type``):
  :func:`engine_attribute`, the backend's ``__getattr__``.
* **Engines written for genlm-core 0.1's contract**: ``load(checkpoint, config)`` or
  ``__init__(checkpoint, config)`` without services (:func:`engine_loader`),
  ``supported_dtypes(config) -> (device, dtypes)`` instead of ``dtypes_on(device)``
  (:func:`dtypes_on`), ``max_context_length`` instead of ``max_positions``
  (:func:`engine_positions`). Such an engine must not rely on what the core used to
  write into it (``self.kv``, ``self.vocab_size``): the capability ``"kv"`` is refused with
  the fix (:func:`genlm_core.engine.contract.check_engine`).

Imports no first-party module: the layers above it call it, never the other way round.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import warnings
from collections.abc import Callable, Collection
from types import CodeType, ModuleType
from typing import Any

#: the genlm-core version that removes everything here
REMOVAL = "0.3"

#: deprecated module path -> the module to import instead (genlm-core's own)
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


def warn(old: str, new: str, removal: str = REMOVAL, stacklevel: int = 3) -> None:
    """The one deprecation warning: ``old`` goes in genlm-core ``removal``; use ``new``."""
    warnings.warn(
        f"{old} is deprecated and will be removed in genlm-core {removal}: {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


# ---------------------------------------------------------------------- moved module paths
#: package -> its ``_deprecated`` module's (MOVED, REMOVAL, ADVICE), or None: it has none
_TABLES: dict[str, tuple[dict[str, str], str, dict[str, str]] | None] = {}


def moved(fullname: str) -> tuple[str, str, str] | None:
    """``(new path, removal release, what to do instead)`` of the deprecated module path
    ``fullname``, from the ``MOVED`` table of its package's ``_deprecated`` module (genlm
    packages only; its ``ADVICE`` says what to do where importing the new path is not it),
    or None."""
    if not fullname.startswith("genlm") or fullname.endswith("._deprecated"):
        return None
    package = fullname.rpartition(".")[0]
    while package:
        if package in sys.modules:
            if package not in _TABLES:
                _TABLES[package] = _table(package)
            table = _TABLES[package]
            if table is not None and fullname in table[0]:
                new = table[0][fullname]
                return new, table[1], table[2].get(fullname, f"import {new}")
        package = package.rpartition(".")[0]
    return None


def _table(package: str) -> tuple[dict[str, str], str, dict[str, str]] | None:
    name = f"{package}._deprecated"
    try:
        if importlib.util.find_spec(name) is None:
            return None
        module = importlib.import_module(name)
    except ImportError:
        return None
    table = getattr(module, "MOVED", None)
    if not isinstance(table, dict):
        return None
    return dict(table), str(getattr(module, "REMOVAL", REMOVAL)), dict(getattr(module, "ADVICE", {}))


def warn_moved(old: str) -> None:
    """The ``DeprecationWarning`` of importing the moved module path ``old``."""
    found = moved(old)
    if found is not None:
        warn(old, found[2], found[1], stacklevel=4)


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
    """Answers for the deprecated paths of genlm packages' ``MOVED`` tables, and for nothing
    else; last on ``sys.meta_path``, so a module that exists is always found first."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        found = moved(fullname)
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, MovedModuleLoader(found[0]))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


# ---------------------------------------------------------------------- the backend's old surface
def engine_attribute(backend: Any, name: str) -> Any:
    """``llm.<name>`` for a public attribute of the engine the backend holds (the backend's
    ``__getattr__``): the engine's value, with a warning to read ``llm.engine.<name>``."""
    engine = backend.__dict__.get("engine")
    if engine is None or name.startswith("_"):
        raise AttributeError(f"{type(backend).__name__!r} object has no attribute {name!r}")
    try:
        value = getattr(engine, name)
    except AttributeError:
        raise AttributeError(
            f"{type(backend).__name__!r} object and its engine {type(engine).__name__!r} have no "
            f"attribute {name!r}"
        ) from None
    warn(
        f"reading the engine's {name!r} through the backend (llm.{name})",
        f"read llm.engine.{name}",
        stacklevel=4,
    )
    return value


# ---------------------------------------------------------------------- engines of the 0.1 contract
def _positional(fn: Callable[..., Any]) -> int | None:
    """How many positional arguments ``fn`` takes (None: any number, or unknown)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in params)


def engine_loader(engine_class: type) -> Callable[[Any, Any, Any], Any]:
    """``engine_class.load`` as ``(checkpoint, config, services) -> engine``. An engine of the
    0.1 contract (``load(checkpoint, config)``, or the default ``load`` over
    ``__init__(checkpoint, config)``) loads without services, with a warning."""
    from_base = _inherited(engine_class, "load")
    old = _positional(engine_class) == 2 if from_base else _positional(engine_class.load) == 2
    if not old:
        return engine_class.load
    what = f"{engine_class.__name__}.{'__init__' if from_base else 'load'}(checkpoint, config)"

    def load(checkpoint: Any, config: Any, services: Any) -> Any:
        warn(what, "take the services too: load(checkpoint, config, services) (docs/plugins.md)")
        return engine_class(checkpoint, config) if from_base else engine_class.load(checkpoint, config)

    return load


def _inherited(engine_class: type, name: str) -> bool:
    """Whether ``engine_class``'s method ``name`` is the contract's default (that of the
    first class in the MRO, from the base, that defines it)."""
    owners = [klass for klass in engine_class.__mro__ if name in vars(klass)]
    return len(owners) <= 1


def dtypes_on(engine_class: type, device: str, config: Any) -> Collection[str] | None:
    """``engine_class.dtypes_on(device)``; an engine of the 0.1 contract that answers
    ``supported_dtypes(config) -> (device, dtypes)`` instead is asked that, with a warning."""
    old = getattr(engine_class, "supported_dtypes", None)
    if old is None or not _inherited(engine_class, "dtypes_on"):
        return engine_class.dtypes_on(device)
    warn(
        f"{engine_class.__name__}.supported_dtypes(config)",
        "answer dtypes_on(device) -> the dtypes the engine computes in there (docs/plugins.md)",
    )
    return old(config)[1]


def engine_positions(engine: Any) -> int | None:
    """The token positions ``engine`` holds: ``max_positions``; an engine of the 0.1 contract
    stating ``max_context_length`` (a limit of ``L`` tokens: ``L + 1`` positions) warns."""
    limit = getattr(engine, "max_context_length", None)
    if limit is None or getattr(engine, "max_positions", None) is not None:
        return engine.max_positions
    warn(f"{type(engine).__name__}.max_context_length", "state max_positions (the context limit + 1)")
    return int(limit) + 1
