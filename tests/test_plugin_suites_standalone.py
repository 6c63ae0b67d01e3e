"""Every plugin's test suite runs outside this repository.

A plugin's tests reach the test models and fixtures through genlm-core's test kit
(``genlm_core.testing``: its pytest plugin comes with genlm-core), never through this
repository's ``tests/`` folder. Oracle: pytest itself, collecting copies of every
``plugins/*/tests`` and ``examples/*/tests`` folder placed in a temporary directory
(collection imports every test module and conftest, which is where a path into the
repository fails), in one process with the source tree off ``sys.path``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = sorted([*ROOT.glob("plugins/*/tests"), *ROOT.glob("examples/*/tests")])


def test_every_plugin_suite_collects_from_a_copy_outside_the_repository(tmp_path: Path) -> None:
    assert len(SUITES) >= 8, SUITES
    for suite in SUITES:
        shutil.copytree(suite, tmp_path / suite.parent.name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # the source tree's own folders stay reachable only as installed packages
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT / "tests"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", tmp_path,
         *sorted(p.name for p in tmp_path.iterdir())],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    collected = {line.split("/", 1)[0] for line in r.stdout.splitlines() if "::" in line}
    assert collected == {s.parent.name for s in SUITES}, collected  # every suite has tests
