"""The plugin is import-light and its registration says how to install it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_plugin_and_listing_import_no_llama_cpp():
    out = _run(
        """
        import json, sys
        import genlm_core
        rows = {r["name"]: r for r in genlm_core.list_backends()}
        genlm_core.backend_config("llama.cpp", model="x.gguf", n_ctx=64)
        choice = genlm_core.resolve("auto", model="/somewhere/model.Q4_0.gguf").name
        heavy = [m for m in ("llama_cpp", "torch", "transformers") if m in sys.modules]
        print(json.dumps({"heavy": heavy, "row": rows["llamacpp"], "choice": choice}))
        """
    )
    data = json.loads(out.strip().splitlines()[-1])
    assert data["heavy"] == []
    assert data["choice"] == "llamacpp"
    reg = data["row"]
    assert reg["status"] == "available"
    assert reg["aliases"] == ["llama.cpp", "gguf"]
    assert reg["model_formats"] == ["gguf"]
    assert reg["distribution"] == "genlm-llamacpp"


def test_without_llama_cpp_listing_says_how_to_install():
    out = _run(
        """
        import sys
        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "llama_cpp":
                    raise ModuleNotFoundError(name)
                return None
        sys.meta_path.insert(0, Hide())
        from genlm_core.tools.cli import main
        main(["backends"])
        """
    )
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("llamacpp"))
    assert "pip install genlm-llamacpp" in line
