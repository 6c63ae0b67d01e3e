"""Fixtures of the core suites.

``installed_fixture_plugins``: the example third-party plugin
(``examples/genlm-example-plugin``) and the deliberately broken one
(``tests/plugins/genlm_broken``), installed for real with pip into a temporary folder
that only the tests using this fixture put on ``sys.path`` (and ``PYTHONPATH`` for
their subprocesses): discovery goes through their real entry points, and nothing is
installed into the environment.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_PLUGINS = [ROOT / "examples" / "genlm-example-plugin", ROOT / "tests" / "plugins" / "genlm_broken"]


def _refresh_registry() -> None:
    from genlm_core.registry import get_registry

    importlib.invalidate_caches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the broken plugin says so
        get_registry(refresh=True)


@pytest.fixture(scope="session")
def installed_fixture_plugins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("fixture-plugins")
    sources = [
        shutil.copytree(
            p, work / "src" / p.name, ignore=shutil.ignore_patterns("build", "*.egg-info", "tests")
        )
        for p in FIXTURE_PLUGINS
    ]
    target = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), *map(str, sources)],
        check=True, timeout=600,
    )  # fmt: skip
    old_env = os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(target), *filter(None, [old_env])])
    _refresh_registry()
    yield target
    sys.path.remove(str(target))
    if old_env is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old_env
    _refresh_registry()
