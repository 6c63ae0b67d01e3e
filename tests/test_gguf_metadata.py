"""The core's GGUF metadata reader (:mod:`genlm_core.engine.gguf_metadata`).

Oracles: the ``gguf`` package (llama.cpp's own Python reader and writer, an independent
implementation of the format) on every GGUF file the test models hold and on files it
writes with every value type in both byte orders; truncations of a real header (every
one must fail cleanly); llama.cpp's own reading of the same files (the context length
and EOS id it loads, through the conformance kit in the llama.cpp suites).
"""

from __future__ import annotations

import functools
import struct
import subprocess
import sys
from pathlib import Path

import gguf  # llama.cpp's Python package (genlm-hf's [gguf] extra): the oracle
import numpy as np
import pytest

from genlm_core.engine.gguf_metadata import GGUFArray, GGUFError, read_gguf_metadata


def _model_ggufs() -> list[Path]:
    from genlm_core import models

    files = sorted(models.cache_dir().glob("models/*.gguf"))
    files.append(models.smollm2_gguf_path())
    return files


@functools.cache
def _oracle(path: Path) -> dict[str, tuple[str, object]]:
    """key -> (type name, value) as the ``gguf`` package reads them."""
    names = {t: t.name.lower() for t in gguf.GGUFValueType}
    out = {}
    for key, fld in gguf.GGUFReader(str(path)).fields.items():
        if key.startswith("GGUF."):
            continue  # the header's counts, not key/value pairs
        types = [names[t] for t in fld.types]
        name = types[0] if len(types) == 1 else f"array[{types[-1]}]" if len(types) == 2 else "array[array]"
        out[key] = (name, fld.contents())
    return out


def _same(a: object, b: object) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return np.float64(a) == np.float64(b) or (np.isnan(a) and np.isnan(b))
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("path", _model_ggufs(), ids=lambda p: p.name)
def test_every_key_of_the_test_models_as_the_gguf_package_reads_it(path: Path) -> None:
    meta = read_gguf_metadata(path, max_array=None)
    want = _oracle(path)
    assert set(meta.values) == set(want)
    for key, (tname, value) in want.items():
        assert meta.types[key] == tname, key
        assert _same(meta.values[key], value), key
    reader = gguf.GGUFReader(str(path))
    assert meta.tensor_count == len(reader.tensors)
    assert meta.version == int(reader.fields["GGUF.version"].contents())
    # arrays past max_array are summarised, the scalars are the same
    short = read_gguf_metadata(path)
    for key, value in meta.values.items():
        if isinstance(value, list) and len(value) > 64:
            assert short.values[key] == GGUFArray(meta.types[key][6:-1], len(value))
        else:
            assert _same(short.values[key], value), key


def test_checkpoint_config_of_the_test_models() -> None:
    """In config.json's key names; expected values from the gguf package's reading."""
    for path in _model_ggufs():
        want = _oracle(path)
        arch = want["general.architecture"][1]
        config = read_gguf_metadata(path).checkpoint_config()
        assert config["max_position_embeddings"] == want[f"{arch}.context_length"][1]
        assert config["eos_token_id"] == want["tokenizer.ggml.eos_token_id"][1]
        file_type = want["general.file_type"][1]
        # llama_ftype: 0 all F32, 1 mostly F16, 32 mostly BF16; quantised types name no float dtype
        assert config.get("dtype") == {0: "float32", 1: "float16", 32: "bfloat16"}.get(file_type), path


def _write_every_type(path: Path, endian: object) -> dict[str, object]:
    T = gguf.GGUFValueType
    values = {
        "t.u8": (255, T.UINT8), "t.i8": (-128, T.INT8), "t.u16": (65535, T.UINT16),
        "t.i16": (-32768, T.INT16), "t.u32": (2**32 - 1, T.UINT32), "t.i32": (-(2**31), T.INT32),
        "t.f32": (0.15625, T.FLOAT32), "t.bool": (True, T.BOOL), "t.str": ("é ü 漢字 \x00 end", T.STRING),
        "t.u64": (2**64 - 1, T.UINT64), "t.i64": (-(2**63), T.INT64), "t.f64": (1 / 3, T.FLOAT64),
        "t.empty_str": ("", T.STRING),
    }  # fmt: skip
    w = gguf.GGUFWriter(str(path), "testarch", endianess=endian)
    for key, (value, vtype) in values.items():
        w.add_key_value(key, value, vtype)
    arrays = {
        "a.ints": [1, -2, 3] * 40,
        "a.floats": [0.5, -1.25],
        "a.strs": ["a", "", "ünï"] * 30,
        "a.nested": [[1, 2], [3]],
    }
    for key, value in arrays.items():
        w.add_array(key, value)
    w.add_uint32("testarch.context_length", 77)
    w.add_eos_token_id(5)
    w.add_file_type(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return {**{k: v for k, (v, _) in values.items()}, **arrays}


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_every_value_type_in_both_byte_orders(tmp_path: Path, endian: str) -> None:
    path = tmp_path / "all.gguf"
    written = _write_every_type(path, gguf.GGUFEndian[endian])
    meta = read_gguf_metadata(path, max_array=None)
    for key, value in written.items():
        got = meta.values[key]
        if key in ("t.f32",):
            assert got == np.float32(value)
        elif key == "a.floats":
            assert got == [float(np.float32(x)) for x in value]
        else:
            assert _same(got, value) or got == value, key
    assert meta.types["t.u64"] == "uint64" and meta.types["a.strs"] == "array[string]"
    assert meta.types["a.nested"] == "array[array]"
    assert meta.checkpoint_config() == {"max_position_embeddings": 77, "eos_token_id": 5, "dtype": "float16"}
    short = read_gguf_metadata(path, max_array=2)
    assert short.values["a.strs"] == GGUFArray("string", 90) and short.values["a.ints"] == GGUFArray(
        "int32", 120
    )
    assert short.values["a.nested"] == [[1, 2], [3]] and short.values["t.f64"] == 1 / 3


def test_empty_arrays_and_a_header_written_by_hand(tmp_path: Path) -> None:
    """The gguf package writes no empty array: this header is laid out by hand from the format."""

    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text.encode())) + text.encode()

    kv = string("e") + struct.pack("<IIQ", 9, 5, 0)  # an empty int32 array
    kv += string("general.architecture") + struct.pack("<I", 8) + string("x")
    kv += string("x.context_length") + struct.pack("<IQ", 10, 4096)  # a uint64 length
    kv += string("tokenizer.ggml.eos_token_id") + struct.pack("<Ii", 5, -1)
    path = tmp_path / "hand.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 2, 0, 4) + kv)
    meta = read_gguf_metadata(path, max_array=None)
    assert meta.version == 2 and meta.tensor_count == 0
    assert meta.values["e"] == [] and meta.types["e"] == "array[int32]"
    assert read_gguf_metadata(path, max_array=0).values["e"] == []  # nothing to summarise
    assert meta.checkpoint_config() == {"max_position_embeddings": 4096, "eos_token_id": -1}


def test_truncated_or_foreign_files_fail_with_the_file_named(tmp_path: Path) -> None:
    path = tmp_path / "all.gguf"
    _write_every_type(path, gguf.GGUFEndian.LITTLE)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in range(len(data)):  # every prefix of the header: a clean error, never another exception
        cut.write_bytes(data[:n])
        with pytest.raises(GGUFError, match="cut.gguf"):
            read_gguf_metadata(cut, max_array=None)
    cut.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(GGUFError, match="magic"):
        read_gguf_metadata(cut)
    cut.write_bytes(data[:4] + (1).to_bytes(4, "little") + data[8:])
    with pytest.raises(GGUFError, match="version 1 is not supported"):
        read_gguf_metadata(cut)
    huge = bytearray(data)
    huge[16:24] = (2**62).to_bytes(8, "little")  # the key/value count
    cut.write_bytes(bytes(huge))
    with pytest.raises(GGUFError, match="key/value pairs"):
        read_gguf_metadata(cut)


def test_reading_imports_no_engine_and_needs_no_gguf_package() -> None:
    path = _model_ggufs()[0]
    code = (
        "import sys\nsys.modules['gguf'] = None  # the gguf package is not needed\n"
        "from genlm_core.engine import read_gguf_metadata\n"
        f"print(read_gguf_metadata({str(path)!r}).checkpoint_config())\n"
        "print(sorted(m for m in ('torch', 'transformers', 'llama_cpp', 'numpy') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "[]"
