"""The shared meaning of ``dtype`` (genlm_core.engine.placement), without any engine."""

from __future__ import annotations

import json
import struct

import pytest

import genlm_core
from genlm_core.config import BackendConfig, ConfigError
from genlm_core.engine import Checkpoint, UnsupportedDtypeError, place
from genlm_core.engine.placement import auto_dtype


def _auto(folder) -> str | None:
    return auto_dtype(Checkpoint.of_files(folder))


def _folder(tmp_path, config=None, tensor_dtype=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    if tensor_dtype is not None:
        header = json.dumps({"w": {"dtype": tensor_dtype, "shape": [1], "data_offsets": [0, 2]}}).encode()
        (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    return tmp_path


def test_auto_reads_the_checkpoint(tmp_path) -> None:
    assert _auto(_folder(tmp_path / "a", {"dtype": "bfloat16"})) == "bfloat16"
    assert _auto(_folder(tmp_path / "b", {"torch_dtype": "float16"})) == "float16"
    nested = {"text_config": {"dtype": "bfloat16"}}
    assert _auto(_folder(tmp_path / "c", nested)) == "bfloat16"
    # no declared dtype: the stored weights' dtype; nothing at all: the default (float32)
    assert _auto(_folder(tmp_path / "d", {}, tensor_dtype="BF16")) == "bfloat16"
    assert _auto(_folder(tmp_path / "e", {})) == "float32"
    assert auto_dtype(Checkpoint.of_files(tmp_path / "e"), None) is None
    # an explicit dtype is used as given: the placement's answer, not the checkpoint's
    folder = _folder(tmp_path / "f", {"dtype": "bfloat16"})
    assert (
        place(BackendConfig(model=str(folder), dtype="float16"), Checkpoint.of_files(folder)).dtype
        == "float16"
    )
    assert place(BackendConfig(model=str(folder)), Checkpoint.of_files(folder)).dtype == "bfloat16"


def test_undeclarable_checkpoint_dtype_asks_for_an_explicit_one(tmp_path) -> None:
    with pytest.raises(ValueError, match="float8_e4m3fn.*pass dtype="):
        _auto(_folder(tmp_path / "a", {"dtype": "float8_e4m3fn"}))


def test_the_old_resolver_is_the_placements_with_a_warning(tmp_path, monkeypatch) -> None:
    """genlm-core 0.1's resolve_dtype / checkpoint_dtype (and their module path) still answer,
    warning; the answer is the placement's."""
    import sys

    import genlm_core.engine as engine

    monkeypatch.delitem(sys.modules, "genlm_core.engine.dtypes", raising=False)  # imported afresh
    folders = [
        _folder(tmp_path / "a", {"dtype": "bfloat16"}),
        _folder(tmp_path / "b", {}, tensor_dtype="F16"),
        _folder(tmp_path / "c", {}),
    ]
    with pytest.warns(DeprecationWarning, match=r"genlm_core\.engine\.dtypes is deprecated"):
        from genlm_core.engine.dtypes import UnsupportedDtypeError as old_error
    assert old_error is UnsupportedDtypeError
    for folder in folders:
        with pytest.warns(
            DeprecationWarning, match=r"genlm_core\.engine\.resolve_dtype .*removed in genlm-core"
        ):
            assert (
                engine.resolve_dtype("auto", folder)
                == place(BackendConfig(), Checkpoint.of_files(folder)).dtype
            )
        with pytest.warns(DeprecationWarning, match="checkpoint_dtype"):
            assert engine.checkpoint_dtype(folder) == auto_dtype(Checkpoint.of_files(folder), None)
    with pytest.warns(DeprecationWarning):
        assert engine.resolve_dtype("float16", folders[0]) == "float16"
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="float64"):
        engine.resolve_dtype("float64", folders[0])


def test_config_accepts_spellings_and_names_bad_values() -> None:
    assert genlm_core.backend_config("mock", dtype="bf16").dtype == "bfloat16"
    assert genlm_core.backend_config("mock", torch_dtype="torch.float16").dtype == "float16"
    with pytest.raises(ConfigError, match="dtype.*float64"):
        genlm_core.backend_config("mock", dtype="float64")


def test_mock_computes_in_float32_only() -> None:
    assert genlm_core.load("mock").dtype == "float32"
    with pytest.raises(UnsupportedDtypeError, match="dtype='bfloat16'.*device 'cpu'"):
        genlm_core.load("mock", dtype="bfloat16")


def test_doctor_and_backends_show_dtype(tmp_path, capsys) -> None:
    from genlm_core.tools.cli import main

    folder = _folder(tmp_path / "m", {"torch_dtype": "bfloat16"})
    assert main(["doctor", "--json", "--model", str(folder)]) == 0
    assert json.loads(capsys.readouterr().out)["dtype_auto"]["dtype"] == "bfloat16"
    assert main(["backends", "--json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out) if r["name"] == "mock"]
    assert rows[0]["dtype"]["default"] == "auto" and "bfloat16" in rows[0]["dtype"]["accepted"]
