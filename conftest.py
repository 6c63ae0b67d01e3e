"""Test-session set-up shared by the core and plugin suites.

The example third-party plugin and the deliberately broken plugin (tests/plugins/)
are installed for real with pip into a private target folder that only the test
session puts on ``sys.path`` (and ``PYTHONPATH`` for subprocesses): discovery goes
through their real entry points, while the main job's environment stays clean.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
FIXTURE_PLUGINS = [ROOT / "tests" / "plugins" / "genlm_example", ROOT / "tests" / "plugins" / "genlm_broken"]
TARGET = ROOT / "build" / "test-plugins"


def _install_fixture_plugins() -> None:
    stamp = TARGET / ".stamp"
    newest = max(p.stat().st_mtime for d in FIXTURE_PLUGINS for p in d.rglob("*") if p.is_file())
    if stamp.exists() and stamp.stat().st_mtime >= newest:
        return
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--upgrade",
            "--target",
            str(TARGET),
            *map(str, FIXTURE_PLUGINS),
        ],
        check=True,
    )
    stamp.touch()


def pytest_configure(config) -> None:
    _install_fixture_plugins()
    sys.path.insert(0, str(TARGET))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TARGET), *filter(None, [os.environ.get("PYTHONPATH")])])
    import warnings

    from genlm_core.registry import get_registry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        get_registry(refresh=True)
