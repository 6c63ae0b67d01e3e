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
* **Old names** (one table, :data:`NAMES`, per package: this module's for genlm-core, each
  genlm plugin's ``_deprecated`` module for its own): a module whose old attribute names
  still answer sets ``__getattr__ = _deprecated.old_names(__name__)`` (or ends its own
  ``__getattr__`` with :func:`old_name`); reading one warns and gives the new one (a
  :class:`Renamed` entry). What a module keeps for old code goes through the same few
  helpers: a renamed property (:func:`renamed_property`), method (:func:`renamed_method`) or
  keyword argument (:func:`renamed_keywords`), and an old plugin's backend module
  (:func:`old_backend`). The old behaviours that are more than a rename are here too
  (:func:`resolve_dtype`, :func:`decode_batches_step`).
* **The engine's attributes read through the backend** (``llm.weights_type``):
  :func:`engine_attribute`, the backend's ``__getattr__``.
* **Engines written for genlm-core 0.1's contract**: ``load(checkpoint, config)`` or
  ``__init__(checkpoint, config)`` without services (:func:`engine_loader`),
  ``supported_dtypes(config) -> (device, dtypes)`` instead of ``dtypes_on(device)``
  (:func:`dtypes_on`), ``max_context_length`` instead of ``max_positions``
  (:func:`engine_positions`). Such an engine must not rely on what the core used to
  write into it (``self.kv``, ``self.vocab_size``): the capability ``"kv"`` is refused with
  the fix (:func:`genlm_core.engine.contract.check_engine`).

Imports no first-party module: the layers above it call it, never the other way round
(what an old name gives is imported by name, with :mod:`importlib`, when it is read).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
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
            "kv_reuse",
            "lora",
            "memory",
            "prefix_cache",
            "progress",
            "row_transport",
            "validation",
            "vocab",
        )
    },
    # modules that only re-exported what lives elsewhere now
    "genlm_core.dtypes": "genlm_core.engine.placement",
    "genlm_core.engine.dtypes": "genlm_core.engine.placement",
    "genlm_core.model_folder": "genlm_core.model_files",
    "genlm_core.engine.model_folder": "genlm_core.model_files",
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
#: package -> its ``_deprecated`` module, or None: it has none
_MODULES: dict[str, ModuleType | None] = {}


def _package_tables(fullname: str) -> list[ModuleType]:
    """The ``_deprecated`` modules of the genlm packages above ``fullname``, innermost first
    (those already imported: a table answers for its package's names only)."""
    found = []
    package = fullname.rpartition(".")[0]
    while package:
        if "__path__" in getattr(sys.modules.get(package), "__dict__", {}):  # a package
            if package not in _MODULES:
                _MODULES[package] = _deprecated_module(package)
            if _MODULES[package] is not None:
                found.append(_MODULES[package])
        package = package.rpartition(".")[0]
    return found


def moved(fullname: str) -> tuple[str, str, str] | None:
    """``(new path, removal release, what to do instead)`` of the deprecated module path
    ``fullname``, from the ``MOVED`` table of its package's ``_deprecated`` module (genlm
    packages only; its ``ADVICE`` says what to do where importing the new path is not it),
    or None."""
    if not fullname.startswith("genlm") or fullname.endswith("._deprecated"):
        return None
    for module in _package_tables(fullname):
        found = vars(module)  # not getattr: a plugin's table module answers old names itself
        table = found.get("MOVED")
        if isinstance(table, dict) and fullname in table:
            new = table[fullname]
            advice = dict(found.get("ADVICE") or {})
            return new, str(found.get("REMOVAL", REMOVAL)), advice.get(fullname, f"import {new}")
    return None


def _deprecated_module(package: str) -> ModuleType | None:
    name = f"{package}._deprecated"
    if name == __name__:
        return sys.modules[__name__]
    try:
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.import_module(name)
    except ImportError:
        return None


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


# ---------------------------------------------------------------------- old names
@dataclass(frozen=True)
class Renamed:
    """An old name that still answers: reading it warns (``advice``: what to do instead)
    and gives ``new``, ``"module:attribute"`` (with ``call``: what calling it returns)."""

    new: str
    advice: str
    call: bool = False

    def value(self) -> Any:
        module, _, attribute = self.new.partition(":")
        found = getattr(importlib.import_module(module), attribute)
        return found() if self.call else found


def moved_names(names: Sequence[str], module: str) -> dict[str, Renamed]:
    """Old names of values that live in ``module`` now, under the same names."""
    return {name: Renamed(f"{module}:{name}", f"import it from {module}") for name in names}


#: module -> its old attribute names (genlm-core's own; each genlm plugin's ``_deprecated``
#: module keeps its own table)
NAMES: dict[str, dict[str, Renamed]] = {
    "genlm_core.trie": {
        "TRIE_IMPLEMENTATIONS": Renamed(
            "genlm_core.trie:trie_implementations",
            "call genlm_core.trie.trie_implementations() (it asks the registry each time)",
            call=True,
        )
    },
    # one dtype resolver: the placement's (dtype="auto" means the same on every path)
    **{
        module: {
            "resolve_dtype": Renamed(
                "genlm_core._deprecated:resolve_dtype",
                "the placement decides the dtype: genlm_core.engine.place(config, checkpoint).dtype, "
                "or genlm_core.engine.placement.auto_dtype(checkpoint) for what dtype='auto' means",
            ),
            "checkpoint_dtype": Renamed(
                "genlm_core._deprecated:checkpoint_dtype",
                "call genlm_core.engine.placement.auto_dtype(Checkpoint.of_files(model), None)",
            ),
        }
        for module in ("genlm_core.engine", "genlm_core.engine.placement", "genlm_core.engine.checkpoint")
    },
}


def old_name(module: str, name: str, stacklevel: int = 2) -> Any:
    """``module.name`` for an old name in the ``NAMES`` table of its package's
    ``_deprecated`` module, with the warning; else the usual AttributeError. ``stacklevel``:
    the reader's frame, counted from the caller (2: the caller's caller)."""
    if name.startswith("__"):  # what the import system asks a module (__path__, ...)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    for table_module in _package_tables(module + ".x"):
        table = vars(table_module).get("NAMES")
        entry = table.get(module, {}).get(name) if isinstance(table, dict) else None
        if entry is not None:
            removal = str(vars(table_module).get("REMOVAL", REMOVAL))
            warn(f"{module}.{name}", entry.advice, removal, stacklevel=stacklevel + 2)
            return entry.value()
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def old_names(module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of a module whose only lazy names are old ones (:func:`old_name`)."""

    def __getattr__(name: str) -> Any:
        return old_name(module, name, stacklevel=2)

    return __getattr__


def renamed_property(old: str, new: str, advice: str) -> property:
    """A read-only property ``old`` (``"Class.attr"``) giving the attribute ``new``, warning
    ``advice``."""

    def read(self: Any) -> Any:
        warn(old, advice)
        return getattr(self, new)

    return property(read, doc=f"Deprecated: :attr:`{new}` ({advice}).")


def renamed_method(old: str, new: str, advice: str) -> Callable[..., Any]:
    """A method ``old`` (``"Class.method"``) calling the method ``new``, warning ``advice``."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        warn(old, advice)
        return getattr(self, new)(*args, **kwargs)

    method.__doc__ = f"Deprecated: :meth:`{new}` ({advice})."
    return method


def renamed_keywords(
    call: str, given: dict[str, Any], renamed: Mapping[str, tuple[str, str]], stacklevel: int = 2
) -> dict[str, Any]:
    """The values of the old keyword arguments of ``call`` (``"drive"``) in ``given``, under
    their new names (``renamed``: old -> (new, advice)), each with a warning; they are taken
    out of ``given``, which keeps the keywords nobody knows. ``stacklevel``: the caller of
    the function taking them, counted from the caller (2: the caller's caller)."""
    out = {}
    for old, (new, advice) in renamed.items():
        if old in given:
            warn(f"{call}({old}=...)", advice, stacklevel=stacklevel + 2)
            out[new] = given.pop(old)
    return out


def old_backend(component: str, engine: str, backend: str, module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of a plugin's ``_deprecated`` module standing in for its old
    backend module ``module`` (``"genlm_mock.backend"``): the engine class (``engine``:
    ``"module:Class"``), the backend class ``backend`` over it (made once; it warns when
    used, naming ``<package>.<backend>``), and ``module``'s old names in the plugin's
    ``NAMES`` table (:func:`old_name`)."""
    engine_module, _, engine_name = engine.partition(":")
    package = engine_module.partition(".")[0]

    def engine_class() -> type:
        return getattr(importlib.import_module(engine_module), engine_name)

    @functools.cache
    def backend_class() -> type:
        make = importlib.import_module("genlm_core.engine.backend").backend_class
        return make(component, engine_class(), deprecated=f"{package}.{backend}")

    def __getattr__(name: str) -> Any:
        if name == engine_name:
            return engine_class()
        if name == backend:
            return backend_class()
        return old_name(module, name, stacklevel=2)

    return __getattr__


def resolve_dtype(requested: str, model: Any) -> str:
    """genlm-core 0.1's dtype resolver: ``requested``, or for ``"auto"`` what the placement
    means by it for the checkpoint at ``model`` (with the core's default dtype, float32)."""
    names = importlib.import_module("genlm_core.dtype_names")
    if requested not in names.DTYPES:
        raise ValueError(f"dtype={requested!r} is not one of {', '.join(names.DTYPES)}")
    if requested != "auto":
        return requested
    return str(checkpoint_dtype(model, default=_default_dtype()))


def checkpoint_dtype(model: Any, default: str | None = None) -> str | None:
    """genlm-core 0.1's dtype that the checkpoint at ``model`` declares (None: it says nothing)."""
    placement = importlib.import_module("genlm_core.engine.placement")
    checkpoint = importlib.import_module("genlm_core.engine.checkpoint").Checkpoint
    files = checkpoint("none") if model is None else checkpoint.of_files(model)
    return placement.auto_dtype(files, default)


def _default_dtype() -> str:
    return str(importlib.import_module("genlm_core.config").BackendConfig.default_dtype)


def decode_batches_step(self: Any, contexts: Sequence[Any], batch_size: int, kv: Any) -> list[Any]:
    """``DecodeBatches.step``: :meth:`~genlm_core.engine.decode_batches.DecodeBatches.run_batches`
    over ``contexts`` cut in batches. Without the rows' handles no kept batch resumes (every
    batch is assembled, from its parents' kept KV where live)."""
    warn(
        "DecodeBatches.step",
        "call decode_step(rows, released, ...) or run_batches(chunks, handles, kv)",
    )
    chunks = [list(contexts[i : i + batch_size]) for i in range(0, len(contexts), batch_size)]
    return self.run_batches(chunks, {}, kv)


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


def loads_without_services(engine_class: type) -> bool:
    """Whether ``engine_class`` loads by the 0.1 contract: ``load(checkpoint, config)``, or
    the default ``load`` over ``__init__(checkpoint, config)`` (:func:`engine_loader`)."""
    if _inherited(engine_class, "load"):
        return _positional(engine_class) == 2
    return _positional(engine_class.load) == 2


def engine_loader(engine_class: type) -> Callable[[Any, Any, Any], Any]:
    """``engine_class.load`` as ``(checkpoint, config, services) -> engine``. An engine of the
    0.1 contract (:func:`loads_without_services`) loads without services, with a warning."""
    if not loads_without_services(engine_class):
        return engine_class.load
    from_base = _inherited(engine_class, "load")
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
