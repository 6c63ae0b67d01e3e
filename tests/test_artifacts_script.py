"""Packaging metadata and ``scripts/test_artifacts.py`` (the CI step that builds every
distribution and tests it installed from its wheel).

Oracles: setuptools itself (a distribution with the deprecated license table really makes
it warn, one with an SPDX expression does not), the artifact script run in a subprocess
on sets that fail (each must still be reported), and the install commands of the sets
with the dependencies the pyprojects declare (what CI installs on each Python, which the
metadata must state exactly).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "test_artifacts.py"
PYPROJECTS = [ROOT / "pyproject.toml", *sorted(ROOT.glob("plugins/*/pyproject.toml")),
              *sorted(ROOT.glob("examples/*/pyproject.toml"))]  # fmt: skip


def _script():
    spec = importlib.util.spec_from_file_location("artifacts_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _project(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: p.parent.name)
def test_spdx_license_and_license_file(pyproject: Path) -> None:
    project = _project(pyproject)
    assert project["license"] == "Apache-2.0"  # an SPDX expression, not the deprecated table
    files = project["license-files"]
    assert files and all((pyproject.parent / f).is_file() for f in files), files
    assert all("Apache License" in (pyproject.parent / f).read_text()[:200] for f in files)
    assert not any(c.startswith("License ::") for c in project.get("classifiers", []))  # PEP 639: not both
    requires = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(7[7-9]|[89]\d)(\.\d+)*", r) for r in requires), requires


def _ci_pythons() -> dict[str, set[str]]:
    """distribution -> the Python versions CI installs it on: the repository's venv (every
    distribution, the first of PYTHONS) and each artifact set's Pythons for what its install
    commands name, with the genlm dependencies those declare."""
    script = _script()
    deps = {}
    for path in PYPROJECTS:
        project = _project(path)
        deps[_norm(project["name"])] = {_norm(re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0])
                                        for r in project.get("dependencies", [])}  # fmt: skip
    out = {name: {script.PYTHONS[0]} for name in deps}
    for spec in script.SETS.values():
        named = set()
        for line in spec["install"]:
            for segment in line.split("&&"):
                words = segment.split()
                if words[:2] == ["pip", "install"]:
                    named |= {_norm(w.split("[")[0]) for w in words[2:] if not w.startswith("-")}
        installed, todo = set(), [n for n in named if n in deps]
        while todo:  # with the genlm distributions they depend on
            name = todo.pop()
            if name not in installed:
                installed.add(name)
                todo += [d for d in deps[name] if d in deps]
        for name in installed:
            out[name] |= set(spec.get("pythons", script.PYTHONS[:1]))
    return out


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: p.parent.name)
def test_python_versions_are_exactly_what_ci_runs(pyproject: Path) -> None:
    project = _project(pyproject)
    tested = sorted(_ci_pythons()[_norm(project["name"])], key=lambda v: tuple(map(int, v.split("."))))
    listed = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if re.fullmatch(r".*:: 3\.\d+", c)]
    assert listed == tested, (listed, tested)
    # the oldest tested version is the floor; no ceiling: a capped requires-python makes pip
    # on a newer Python fall back to an older release without the cap instead of failing
    assert project["requires-python"] == f">={tested[0]}"


def _dist(folder: Path, license_line: str) -> Path:
    (folder / "pkg_x").mkdir(parents=True)
    (folder / "pkg_x" / "__init__.py").write_text("")
    (folder / "LICENSE").write_text("Apache License\n")
    (folder / "README.md").write_text("A distribution made by a test.\n")
    (folder / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=77.0.3"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{folder.name}"
            version = "0.0.1"
            readme = "README.md"
            {license_line}

            [tool.setuptools.packages.find]
            include = ["pkg_x*"]
            """
        )
    )
    return folder


def test_a_build_warning_fails_that_build_and_not_the_others(tmp_path: Path, monkeypatch) -> None:
    """setuptools warns about ``license = { text = ... }`` (its build still succeeds); the
    script reports that distribution as failed, names the warning, and builds the rest."""
    script = _script()
    monkeypatch.setattr(script, "DIST", tmp_path / "dist")
    old = _dist(tmp_path / "old-style", 'license = { text = "Apache-2.0" }')
    new = _dist(tmp_path / "new-style", 'license = "Apache-2.0"\nlicense-files = ["LICENSE"]')
    sizes, failures = script.build(sys.executable, [old, new])
    assert set(failures) == {str(old)}, failures
    assert "build warnings are errors" in failures[str(old)] and "project.license" in failures[str(old)]
    assert {"new_style-0.0.1-py3-none-any.whl", "new_style-0.0.1.tar.gz"} <= set(sizes)


def test_every_set_runs_and_is_reported_when_one_fails(tmp_path: Path) -> None:
    """Two sets whose install commands the docs no longer hold: both are tried and reported,
    the summary names both, and the exit status is 1 (no build here: the sets fail first)."""
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        from pathlib import Path
        spec = importlib.util.spec_from_file_location("a", {str(SCRIPT)!r})
        a = importlib.util.module_from_spec(spec); spec.loader.exec_module(a)
        a.OUT = Path({str(tmp_path)!r}); a.DIST = a.OUT / "dist"
        a.build = lambda tools, folders=None: ({{}}, {{}})
        a.SETS = {{name: {{"install": ["pip install nothing-" + name], "docs": "", "tests": []}} for name in ("one", "two")}}
        sys.argv = ["test_artifacts.py", "--sets", "one,two"]
        sys.exit(a.main())
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["outcomes"]) == {"one@3.11", "two@3.11"}
    assert all(v.startswith("FAILED: the docs no longer say") for v in summary["outcomes"].values())
    assert "0 passed, 2 failed" in r.stdout
