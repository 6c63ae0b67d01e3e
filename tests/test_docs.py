"""The configuration reference is generated from the pydantic models: it must match them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from genlm_core.registry import FIRST_PARTY

ROOT = Path(__file__).resolve().parent.parent


def test_configuration_reference_is_up_to_date() -> None:
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr + res.stdout


def test_configuration_reference_documents_every_first_party_backend() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for name in FIRST_PARTY:
        assert f"## backend `{name}`" in text, name
