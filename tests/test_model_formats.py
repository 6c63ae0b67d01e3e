"""``load("auto", model=...)`` skips the backends that cannot read what was given.

Each backend declares the model formats it reads in its registration
(``model_formats``); the core classifies the ``model`` argument from the file system
alone (:mod:`genlm_core.registry.model_formats`). Oracles: folders and files made here
with known contents, real registrations of the installed plugins (narrowed with
``GENLM_DISABLE_PLUGINS`` in a fresh interpreter, as a user with fewer plugins has them),
and the modules loaded (no engine may be imported to decide).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from genlm_core.registry import FIRST_PARTY, Registry
from genlm_core.registry.model_formats import model_formats

#: the first-party plugins to hide (their entry points are named as their backends) so only
#: genlm-llamacpp is left: what `pip install genlm-core genlm-llamacpp` has; likewise genlm-hf
ONLY_LLAMACPP = ",".join(n for n in FIRST_PARTY if n != "llamacpp")
ONLY_HF = ",".join(n for n in FIRST_PARTY if n != "hf")


def _auto(model: str, disabled: str) -> dict:
    """What load(model=...) does in a fresh interpreter with the plugins ``disabled``
    hidden: the backend it picks, or its error; and the engine modules it imported."""
    code = textwrap.dedent(
        f"""
        import json, sys
        import genlm_core
        out = {{}}
        try:
            out["choice"] = genlm_core.resolve(model={model!r}).name
        except Exception as exc:
            out["error"] = f"{{type(exc).__name__}}: {{exc}}"
        try:
            genlm_core.load(model={model!r})
        except Exception as exc:
            out["load_error"] = f"{{type(exc).__name__}}: {{exc}}"
        out["engines"] = [m for m in ("torch", "transformers", "vllm", "mlx", "llama_cpp") if m in sys.modules]
        print(json.dumps(out))
        """
    )
    env = {**os.environ, "GENLM_DISABLE_PLUGINS": disabled}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_an_hf_folder_with_only_llamacpp_says_to_install_genlm_hf(tiny_llama_path: Path) -> None:
    out = _auto(str(tiny_llama_path), ONLY_LLAMACPP)
    assert "choice" not in out, out  # llama.cpp cannot read a transformers folder: not picked
    for key in ("error", "load_error"):
        msg = out[key]
        assert msg.startswith("UnavailableImplementationError"), msg
        assert "Hugging Face model folder" in msg and "pip install genlm-hf" in msg, msg
        assert "GGUF file" in msg, msg  # the other way out: a file the installed backend reads
        assert ".gguf file; name one" not in msg, msg  # not llama.cpp's complaint about the folder
    assert out["engines"] == [], out  # decided from the registrations, no engine imported


def test_a_hub_id_with_only_llamacpp_says_to_install_genlm_hf() -> None:
    out = _auto("HuggingFaceTB/SmolLM2-135M", ONLY_LLAMACPP)
    assert "Hugging Face hub id" in out["error"] and "pip install genlm-hf" in out["error"], out
    assert out["engines"] == [], out


def test_a_gguf_file_with_only_hf_says_to_install_genlm_llamacpp(tmp_path: Path) -> None:
    gguf = tmp_path / "model.Q4_0.gguf"
    gguf.write_bytes(b"GGUF")
    out = _auto(str(gguf), ONLY_HF)
    assert "GGUF file" in out["error"] and "pip install genlm-llamacpp" in out["error"], out
    assert "Hugging Face model folder" in out["error"], out  # what the installed hf reads
    assert out["engines"] == [], out


def test_each_format_goes_to_the_backend_that_reads_it(tiny_llama_path: Path, tmp_path: Path) -> None:
    """Both installed: a folder goes to transformers, a GGUF file (or a folder holding only
    GGUF files) to llama.cpp, whatever their priorities say."""
    gguf_folder = tmp_path / "ggufs"
    gguf_folder.mkdir()
    (gguf_folder / "m.gguf").write_bytes(b"GGUF")
    code = textwrap.dedent(
        f"""
        import json, genlm_core
        print(json.dumps([genlm_core.resolve(model=m).name for m in
                          ({str(tiny_llama_path)!r}, {str(gguf_folder / "m.gguf")!r}, {str(gguf_folder)!r}, "gpt2")]))
        """
    )
    env = {**os.environ, "GENLM_DISABLE_PLUGINS": "mlx,vllm,mock,remote,compat"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ["hf", "llamacpp", "llamacpp", "hf"]


def test_model_formats_from_the_file_system(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    both = tmp_path / "both"
    both.mkdir()
    (both / "config.json").write_text("{}")
    (both / "w.GGUF").write_bytes(b"GGUF")
    empty = tmp_path / "empty"
    empty.mkdir()
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    assert model_formats(hf) == {"hf-folder"}
    assert model_formats(str(both)) == {"hf-folder", "gguf"}
    assert model_formats(both / "w.GGUF") == {"gguf"}
    assert model_formats(empty) == {"hf-folder"}  # the folder checks then say what it lacks
    assert model_formats(weights) == {"safetensors"}
    assert model_formats(str(tmp_path / "missing.gguf")) == {"gguf"}  # a file's suffix, even missing
    assert model_formats("gpt2") == {"hub-id"} and model_formats("org/name") == {"hub-id"}
    assert model_formats(tmp_path / "missing") is None  # the backend's folder check reports it
    assert model_formats(None) is None


def _registry(**registrations: dict) -> Registry:
    reg = Registry()
    for name, kw in registrations.items():
        reg._make_register("backend", f"plugin-{name}", f"dist-{name}", "1")(
            name, "json:dumps", requires=["json"], **kw
        )
    return reg


def test_undeclared_backends_stay_candidates_and_declared_ones_are_filtered(tmp_path: Path) -> None:
    """A registration without ``model_formats`` (written before the declaration existed)
    is a candidate for every model; one with ``[]`` reads no model and gets none given."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    reg = _registry(
        legacy={"priority": 5},
        table={"priority": 90, "model_formats": []},
        gguf_reader={"priority": 1, "model_formats": ["GGUF"]},
    )
    assert reg.choose_auto(model=None)[0].name == "table"  # no model: every backend's default
    assert reg.choose_auto(model=str(gguf))[0].name == "legacy"  # 5 > 1, both read it
    assert reg.choose_auto(model="gpt2")[0].name == "legacy"
    choice, _, considered = reg.choose_auto(model=str(gguf))
    skipped = {c["name"]: c for c in considered if c["status"] == "skipped"}
    assert set(skipped) == {"table"} and "reads no model" in skipped["table"]["reason"]
    only_declared = _registry(table={"model_formats": []}, gguf_reader={"model_formats": ["gguf"]})
    with pytest.raises(RuntimeError, match=r"hub id.*no installed backend reads it.*GGUF file"):
        only_declared.choose_auto(model="gpt2")


def test_model_formats_must_be_a_list() -> None:
    with pytest.raises(ValueError, match="model_formats must be a list"):
        _registry(bad={"model_formats": "gguf"})
