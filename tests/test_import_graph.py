"""First-party modules import each other without a circle and without private names.

The graph holds the modules of genlm_core, of every plugin's packages and of the
example plugin, and counts every import of one of them at every level: at the top,
inside functions, and under ``if TYPE_CHECKING:`` (a function-level or type-checking
import still ties the two modules: neither can be read, moved or tested without the
other). No module imports another module's private name (``_name``); a private module
(whose names are public) is imported within its own distribution only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import genlm_core

CORE = Path(genlm_core.__file__).resolve().parent
REPO = CORE.parent


def package_roots() -> dict[str, Path]:
    """Top-level package name -> its folder: the core, every plugin's, the example's."""
    roots = {"genlm_core": CORE}
    for dist in [*sorted((REPO / "plugins").glob("*")), *sorted((REPO / "examples").glob("*"))]:
        for folder in sorted(dist.glob("*")) if dist.is_dir() else []:
            if folder.name in ("tests", "build") or folder.name.startswith(".") or not folder.is_dir():
                continue
            if (folder / "__init__.py").is_file():
                roots[folder.name] = folder
            else:  # a namespace package (genlm-compat's `genlm`): its packages
                for sub in sorted(folder.glob("*/__init__.py")):
                    roots[f"{folder.name}.{sub.parent.name}"] = sub.parent
    return roots


def modules(roots: dict[str, Path] | None = None) -> dict[str, Path]:
    """Module name -> file, for every module under ``roots`` (tests excluded)."""
    out = {}
    for package, root in (roots or package_roots()).items():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("").parts
            if "tests" in rel:
                continue
            parts = (package, *rel)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _owner(name: str, known: dict[str, Path]) -> str | None:
    """The module ``name`` is, or the package it is an attribute of."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str, int]]:
    """``(imported module, name as written, line)`` of every first-party import in ``path``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                owner = _owner(a.name, known)
                if owner:
                    found.append((owner, a.name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            for a in node.names:
                full = f"{base}.{a.name}"
                owner = full if full in known else _owner(base, known)
                if owner:
                    found.append((owner, full, node.lineno))
    return [f for f in found if f[0] != module]


def import_graph(known: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the first-party modules it imports (at every level)."""
    known = known if known is not None else modules()
    return {m: {owner for owner, _, _ in _imports(m, p, known)} for m, p in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search, iterative)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        stacks = [iter(sorted(graph[start]))]
        state[start] = 1
        while stacks:
            nxt = next(stacks[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stacks.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stacks.append(iter(sorted(graph.get(nxt, ()))))
    return None


def private_imports(known: dict[str, Path] | None = None) -> list[str]:
    """Imports of a private name (``_x``, not a dunder): a private attribute of another
    module, or a private module of another distribution. A private module's public names
    are what its own distribution imports (``from genlm_core.trie import _kernels`` in
    genlm_core.trie.cpu, ``from genlm.backend._surface import placeholder`` in genlm-compat)."""
    known = known if known is not None else modules()
    bad = []
    for module, path in known.items():
        top = module.split(".")[0]
        for _, written, line in _imports(module, path, known):
            module_part, attr = (written, "") if written in known else written.rpartition(".")[::2]
            if attr.startswith("_") and not attr.startswith("__"):
                bad.append(written)
            elif module_part.split(".")[0] != top and any(
                p.startswith("_") and not p.startswith("__") for p in module_part.split(".")
            ):
                bad.append(written)
            else:
                continue
            where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            bad[-1] = f"{where}:{line}: {written}"
    return bad


def test_the_graph_holds_the_core_every_plugin_and_the_example() -> None:
    roots = package_roots()
    expected = {"genlm_core", "genlm_hf", "genlm_vllm", "genlm_mlx", "genlm_llamacpp", "genlm_mock"}
    assert expected | {"genlm_remote", "genlm.backend", "genlm.bytes", "genlm_example"} <= set(roots)


def test_first_party_code_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_first_party_code_imports_no_private_name() -> None:
    assert private_imports() == []


def test_the_cycle_finder_finds_cycles() -> None:
    # the oracle for the test above: a graph with a known cycle, one without
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.fixture
def fake_package(tmp_path: Path) -> dict[str, Path]:
    """A package whose imports are known: a mutual import under TYPE_CHECKING, one inside a
    function, a private name from a sibling, and a private module of its own."""
    pkg = tmp_path / "fake"
    pkg.mkdir()
    files = {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fake.b import B\n",
        "b.py": "def f():\n    from fake import a\n\nfrom fake.c import _hidden\n",
        "c.py": "_hidden = 1\nfrom fake import _kernels\n",
        "_kernels.py": "",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    return modules({"fake": pkg})


def test_the_graph_sees_every_level(fake_package: dict[str, Path]) -> None:
    graph = import_graph(fake_package)
    assert "fake.b" in graph["fake.a"]  # under TYPE_CHECKING
    assert "fake.a" in graph["fake.b"]  # inside a function
    assert find_cycle(graph) in (["fake.a", "fake.b", "fake.a"], ["fake.b", "fake.a", "fake.b"])
    assert graph["fake.c"] == {"fake._kernels"}


def test_private_names_are_found_but_own_private_modules_pass(fake_package: dict[str, Path]) -> None:
    found = private_imports(fake_package)
    assert len(found) == 1 and found[0].endswith(": fake.c._hidden"), found


def test_the_real_graph_sees_function_level_imports() -> None:
    graph = import_graph()
    # demo imports the shared CLI options inside a function; config imports them at the top
    assert "genlm_core.tools.cli_options" in graph["genlm_core.tools.demo"]
    assert "genlm_core.errors" in graph["genlm_core.config"]
    assert "genlm_core.tools.demo" in graph["genlm_core.tools.cli"]


def package_graph(graph: dict[str, set[str]], root: str = "genlm_core") -> dict[str, set[str]]:
    """The graph of ``root``'s parts: its subpackages and top-level modules
    (``genlm_core.engine``, ``genlm_core.config``, ...); an import between two modules of
    one part is not an edge. The package's ``__init__`` (the public face, importing its
    parts lazily) is left out."""
    prefix = root + "."

    def part(module: str) -> str | None:
        if not module.startswith(prefix):
            return None
        return prefix + module[len(prefix) :].split(".")[0]

    out: dict[str, set[str]] = {}
    for module, imported in graph.items():
        a = part(module)
        if a is None:
            continue
        out.setdefault(a, set())
        for other in imported:
            b = part(other)
            if b is not None and b != a:
                out[a].add(b)
    return out


def test_the_cores_parts_have_no_circle() -> None:
    """No circle between the core's parts either: config and the registry sit below the
    engine package (they name dtypes and model folders from genlm_core.dtype_names and
    genlm_core.model_files, not from engine modules), so no arrow points back up."""
    parts = package_graph(import_graph())
    cycle = find_cycle(parts)
    assert cycle is None, "circle between the core's parts: " + " -> ".join(cycle or [])
    assert "genlm_core.engine" not in parts["genlm_core.config"]
    assert "genlm_core.engine" not in parts["genlm_core.registry"]


def test_no_package_has_a_circle_between_its_parts() -> None:
    """At every level: within each package of the core and of every plugin
    (``genlm_core.engine``, ``genlm_core.engine.vocab``, ``genlm_hf``...), the graph of its
    direct parts has no circle."""
    known = modules()
    graph = import_graph(known)
    packages = sorted(m for m, path in known.items() if path.name == "__init__.py")
    circles = {}
    for package in packages:
        cycle = find_cycle(package_graph(graph, package))
        if cycle is not None:
            circles[package] = " -> ".join(cycle)
    assert not circles, f"circles between a package's parts: {circles}"


def test_the_part_graph_sees_a_circle_between_packages() -> None:
    # the oracle: two modules of different parts importing each other's part
    graph = {
        "genlm_core.config": {"genlm_core.errors"},
        "genlm_core.engine.dtypes": {"genlm_core.errors"},
        "genlm_core.engine.backend": {"genlm_core.config"},
        "genlm_core.errors": set(),
    }
    assert find_cycle(package_graph(graph)) is None
    graph["genlm_core.errors"] = {"genlm_core.engine.backend"}
    assert find_cycle(package_graph(graph)) is not None
