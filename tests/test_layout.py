"""The core's layout: grouped by audience, old module paths kept, modules short or explained.

Oracles: the files on disk (what the package holds), a fresh interpreter (what an import
really loads), and the module objects themselves (an old path must give the same object
as the new one, not a copy).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import genlm_core
from genlm_core._deprecated import MOVED, NAMES

ROOT = Path(genlm_core.__file__).resolve().parent
REPO = ROOT.parent

#: the package's top level: what every user touches, nothing else
TOP_LEVEL = {
    "__init__.py",
    "_deprecated.py",
    "api.py",
    "config.py",
    "dtype_names.py",  # what dtype= means, below config, the registry and the engines
    "errors.py",
    "model_files.py",  # what model= names (a folder or a hub id), below the same three
    "protocols.py",
    "token.py",
}
#: one folder per audience (docs/architecture.md)
PACKAGES = {"engine", "registry", "models", "tools", "trie", "bytes", "serve", "testing"}
#: a module longer than this says at its top why it is one module
MAX_LINES = 500
REASON = "Kept in one module"


def _code_files() -> list[Path]:
    """The first-party code: the core, the plugins' packages and the benchmarks (not
    tests, and not what a run leaves there, such as a benchmark's own venv)."""
    roots = [ROOT, *sorted((REPO / "plugins").glob("*/*")), REPO / "benchmarks"]
    files = []
    for root in roots:
        if root.is_dir() and root.name != "tests":
            for path in root.rglob("*.py"):
                parts = path.relative_to(root).parts
                if "tests" not in parts and not any(p.startswith(".") or p == "site-packages" for p in parts):
                    files.append(path)
    return files


def test_the_top_level_holds_only_what_every_user_touches() -> None:
    assert {p.name for p in ROOT.glob("*.py")} == TOP_LEVEL
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages == PACKAGES


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_moved_module_itself(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    assert importlib.import_module(old) is new
    assert sys.modules[old] is new
    assert new.__name__ == MOVED[old] and new.__spec__.name == MOVED[old]  # not renamed by the alias
    parent, _, leaf = old.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is new  # `from genlm_core import cli`


def test_old_paths_work_in_a_fresh_interpreter_without_importing_engines() -> None:
    code = (
        "import sys\n"
        "from genlm_core.backend import BaseLogprobBackend\n"
        "from genlm_core.embedded import smollm2_path\n"
        "from genlm_core import hardware, smc\n"
        "import genlm_core.engine.backend as new\n"
        "assert BaseLogprobBackend is new.BaseLogprobBackend\n"
        "assert smc.__name__ == 'genlm_core.tools.sis'\n"
        "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'mlx') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_an_old_path_warns_naming_the_new_one_and_the_removal_version() -> None:
    from genlm_core._deprecated import REMOVAL

    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import genlm_core.embedded\n"
        "    import genlm_core.models\n"  # the new path: no warning
        "print([(w.category.__name__, str(w.message)) for w in caught if 'genlm_core' in str(w.message)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ast.literal_eval(out.stdout.strip()) == [
        (
            "DeprecationWarning",
            f"genlm_core.embedded is deprecated and will be removed in genlm-core {REMOVAL}: "
            "import genlm_core.models",
        )
    ]


def test_python_m_with_an_old_path_runs_the_moved_program() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "genlm_core.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: genlm")


def test_first_party_code_imports_no_old_path() -> None:
    """The table is for users' code: ours imports the new paths."""
    found = []
    for path in _code_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [f"{path.relative_to(REPO)}: {n}" for n in names if n in MOVED]
    assert found == []


def test_engine_is_one_import_point_that_loads_on_use() -> None:
    import genlm_core.engine as engine

    for name, module in engine.EXPORTS.items():
        assert getattr(engine, name) is getattr(importlib.import_module(module), name), name
    assert set(engine.__all__) == set(engine.EXPORTS) <= set(dir(engine))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        engine.nothing_here  # noqa: B018
    loaded = {}
    for target in ("genlm_core", "genlm_core.engine"):
        code = f"import sys, {target}\nprint(sorted(m for m in sys.modules if m.startswith('genlm_core')))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        loaded[target] = set(ast.literal_eval(out.stdout.strip()))
    # the package adds only itself to what `import genlm_core` loads: its names load on use
    assert loaded["genlm_core.engine"] - loaded["genlm_core"] <= {"genlm_core.engine"}
    assert "genlm_core.engine.row_transport" not in loaded["genlm_core.engine"]  # imports torch


def test_a_long_module_says_why_at_its_top() -> None:
    long = []
    for path in _code_files():
        lines = path.read_text().count("\n")
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MAX_LINES and REASON not in doc:
            long.append(f"{path.relative_to(REPO)} ({lines} lines)")
    assert long == [], f"over {MAX_LINES} lines without '{REASON}: ...' in the docstring"


#: first-party backend name -> the module holding its engine (every plugin's is ``engine.py``)
ENGINE_MODULES = {
    "hf": "genlm_hf.engine",
    "vllm": "genlm_vllm.engine",
    "mlx": "genlm_mlx.engine",
    "llamacpp": "genlm_llamacpp.engine",
    "mock": "genlm_mock.engine",
    "remote": "genlm_remote.engine",
}


def test_every_plugin_registers_the_engine_of_its_engine_module() -> None:
    from genlm_core.engine import Engine
    from genlm_core.registry import get_registry

    for name, module in ENGINE_MODULES.items():
        reg = get_registry().get("backend", name)
        assert reg.target.split(":")[0] == module, (name, reg.target)
        assert issubclass(reg.load_target(), Engine)


def _package_roots() -> dict[str, Path]:
    roots = {"genlm_core": ROOT}
    for folder in sorted((REPO / "plugins").glob("genlm_*/genlm_*")):
        if (folder / "__init__.py").is_file():
            roots[folder.name] = folder
    return roots


def test_each_package_keeps_its_shims_in_one_deprecated_module() -> None:
    """Each package's ``_deprecated.py`` says the release that removes what it holds, and
    every old module path it lists resolves to a module that answers for it."""
    from genlm_core import _deprecated

    for package, root in _package_roots().items():
        if not (root / "_deprecated.py").is_file():
            continue
        module = importlib.import_module(f"{package}._deprecated")
        assert module.REMOVAL == "0.3", package
        for old, new in getattr(module, "MOVED", {}).items():
            assert old.startswith(package + ".") and importlib.import_module(new), (old, new)
            found = _deprecated.moved(old)
            assert found is not None and found[:2] == (new, "0.3"), (old, found)
            if not (root / (old.rpartition(".")[2] + ".py")).is_file():  # no file answers first
                spec = _deprecated.MovedModuleFinder().find_spec(old)
                assert spec is not None and spec.loader.target == new  # type: ignore[union-attr]
    for package in ("genlm_mock", "genlm_mlx", "genlm_llamacpp", "genlm_vllm", "genlm_remote"):
        assert not (_package_roots()[package] / "backend.py").exists(), package  # the alias files went


def test_a_plugins_old_backend_names_still_load_warning() -> None:
    from genlm_mock import _deprecated as mock_old
    from genlm_mock.engine import MockEngine

    from genlm_core.engine import BaseLogprobBackend

    assert mock_old.MockEngine is MockEngine and mock_old.MockBackend is mock_old.MockBackend
    assert (
        issubclass(mock_old.MockBackend, BaseLogprobBackend)
        and mock_old.MockBackend.engine_class is MockEngine
    )
    with pytest.warns(DeprecationWarning, match="genlm_mock.MockBackend is deprecated.*genlm-core 0.3"):
        llm = mock_old.MockBackend(MockEngine())
    assert llm.next_token_logprobs_sync([1, 2]).shape == (llm.vocab_size,)
    llm.close()
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        mock_old.nothing  # noqa: B018


#: modules that still warn themselves: genlm-compat, which repeats genlm-backend's and
#: genlm-bytes' own deprecations word for word
WARNS_ITSELF = {
    "plugins/genlm_compat/genlm/backend/trie/__init__.py",
    "plugins/genlm_compat/genlm/bytes/trie.py",
    "plugins/genlm_compat/genlm/bytes/__init__.py",
}


def test_old_names_live_in_the_packages_deprecated_module() -> None:
    """One address per old name: a module that keeps one for older code binds it to its
    package's ``_deprecated`` module (genlm_core._deprecated's helpers), never warns itself."""
    found = []
    for path in _code_files():
        rel = str(path.relative_to(REPO))
        if path.name == "_deprecated.py" or rel in WARNS_ITSELF or rel.startswith("benchmarks/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Name) and node.id == "DeprecationWarning":
                found.append(f"{rel}:{node.lineno}")
    assert found == []


@pytest.mark.parametrize(("module", "name"), sorted((m, n) for m, names in NAMES.items() for n in names))
def test_an_old_name_answers_warning_with_the_new_address(module: str, name: str) -> None:
    from genlm_core._deprecated import REMOVAL

    entry = NAMES[module][name]
    owner = importlib.import_module(module)
    with pytest.warns(
        DeprecationWarning, match=rf"^{module}\.{name} is deprecated .* genlm-core {REMOVAL}: "
    ):
        value = getattr(owner, name)
    target, _, attribute = entry.new.partition(":")
    found = getattr(importlib.import_module(target), attribute)
    assert value == (found() if entry.call else found)
