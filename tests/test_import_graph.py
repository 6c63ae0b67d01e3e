"""genlm_core's modules import each other without a cycle.

The graph counts every import of a genlm_core module, also those inside functions
(a function-level import still ties the two modules: neither can be read, moved or
tested without the other) but not those under ``if TYPE_CHECKING:`` (never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import genlm_core

PACKAGE = "genlm_core"
ROOT = Path(genlm_core.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` is, or the package it is an attribute of."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _run_time_nodes(node: ast.AST):
    """Every node below ``node``, except the bodies of ``if TYPE_CHECKING:`` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                yield other
                yield from _run_time_nodes(other)
            continue
        yield child
        yield from _run_time_nodes(child)


def _imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str | None] = set()
    for node in _run_time_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_owner(a.name, modules) for a in node.names if a.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            if base.startswith(PACKAGE):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in modules else _owner(base, modules))
    return {m for m in found if m is not None and m != module}


def import_graph() -> dict[str, set[str]]:
    """Module -> the genlm_core modules it imports (anywhere but under TYPE_CHECKING)."""
    modules = _modules()
    return {module: _imports_of(module, path, modules) for module, path in modules.items()}


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
                stacks.append(iter(sorted(graph[nxt])))
    return None


def test_genlm_core_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_cycles() -> None:
    # the oracle for the test above: a graph with a known cycle, one without
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_function_level_imports() -> None:
    graph = import_graph()
    # demo imports the shared CLI options inside a function; config imports them at the top
    assert "genlm_core.tools.cli_options" in graph["genlm_core.tools.demo"]
    assert "genlm_core.errors" in graph["genlm_core.config"]
    assert "genlm_core.tools.demo" in graph["genlm_core.tools.cli"]
