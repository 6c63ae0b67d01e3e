"""The plugin is import-light and its registration says how to install it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_plugin_and_listing_import_no_mlx():
    out = _run(
        """
        import json, sys
        import genlm_mlx.plugin, genlm_mlx.config
        import genlm_core
        rows = {r["name"]: r for r in genlm_core.list_backends()}
        genlm_core.backend_config("mlx", model="x", prefill_step_size=8)
        heavy = [m for m in ("mlx", "mlx.core", "mlx_lm", "torch", "transformers") if m in sys.modules]
        print(json.dumps({"heavy": heavy, "mlx": rows["mlx"]}))
        """
    )
    data = json.loads(out.strip().splitlines()[-1])
    assert data["heavy"] == []
    reg = data["mlx"]
    assert reg["status"] == "available"
    assert reg["devices"] == ["mps", "cpu"]
    assert reg["priority"] == {"mps": 100, "cpu": 0}
    assert reg["distribution"] == "genlm-mlx"


def test_without_mlx_listing_says_how_to_install():
    # Hide mlx and mlx_lm from the import system, then ask the CLI.
    out = _run(
        """
        import sys
        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("mlx", "mlx_lm"):
                    raise ModuleNotFoundError(name)
                return None
        sys.meta_path.insert(0, Hide())
        from genlm_core.tools.cli import main
        main(["backends"])
        """
    )
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("mlx"))
    assert "pip install genlm-mlx" in line and "mlx" in line


def test_unknown_option_is_a_clear_error():
    import genlm_core

    with pytest.raises(genlm_core.ConfigError, match="prefill_step_size"):
        genlm_core.backend_config("mlx", prefil_step_size=4)


def test_missing_model_folder_is_a_clear_error(tmp_path):
    import genlm_core

    with pytest.raises(genlm_core.ConfigError, match="does not exist"):
        genlm_core.load("mlx", model=str(tmp_path / "nope"))
