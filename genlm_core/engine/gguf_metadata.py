"""The key/value metadata of a GGUF file, read with the standard library alone.

A GGUF file (llama.cpp's checkpoint format) starts with a header: the magic ``GGUF``,
a version, the tensor and key/value counts, then the key/value pairs (a string key, a
``uint32`` value type, the value: an integer, float, bool, string, or a typed array of
those). Tensor data follows and is never read here. Versions 2 and 3 are read (counts
and lengths are ``uint64``; version 1, from 2023, used ``uint32`` and is refused), in
either byte order (a big-endian file reads its version byte-swapped).

:func:`read_gguf_metadata` returns a :class:`GGUFMetadata`: the values by key, with
arrays longer than ``max_array`` (the vocabulary, merges and scores: tens of thousands
of entries) kept as :class:`GGUFArray` summaries (item type and length) unless asked
for. :meth:`GGUFMetadata.checkpoint_config` gives what the checkpoint policy
(:mod:`genlm_core.engine.checkpoint`) reads from a ``config.json``, in its key names, so
one policy answers for both kinds of checkpoint: the context length as
``max_position_embeddings``, ``tokenizer.ggml.eos_token_id`` as ``eos_token_id`` and,
for unquantised files, the weights' ``dtype``.

Malformed input (not a GGUF, truncated, an unknown value type, a length past the end of
the file) raises :class:`GGUFError` (a ``ValueError``) naming the file and the offset.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["GGUFArray", "GGUFError", "GGUFMetadata", "read_gguf_metadata"]

MAGIC = b"GGUF"

#: GGUF value type -> struct format of one scalar (8: string, 9: array, read apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
TYPE_NAMES = {
    0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32",
    7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64",
}  # fmt: skip

#: ``general.file_type`` (llama.cpp's ``llama_ftype``) of the unquantised files -> dtype
FILE_TYPE_DTYPES = {0: "float32", 1: "float16", 32: "bfloat16"}


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class GGUFArray:
    """An array value left unread: its item type and length."""

    item_type: str
    length: int


@dataclass
class GGUFMetadata:
    """The header of one GGUF file: format version, tensor count, key/value pairs."""

    path: Path
    version: int
    tensor_count: int
    values: dict[str, Any] = field(default_factory=dict)
    #: key -> the value's GGUF type name (``"uint32"``, ``"string"``, ``"array[string]"``)
    types: dict[str, str] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    @property
    def architecture(self) -> str | None:
        arch = self.values.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def context_length(self) -> int | None:
        """Positions the model was trained with (``{architecture}.context_length``)."""
        n = self.values.get(f"{self.architecture}.context_length") if self.architecture else None
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    def eos_token_id(self) -> int | None:
        eos = self.values.get("tokenizer.ggml.eos_token_id")
        return eos if isinstance(eos, int) and not isinstance(eos, bool) else None

    def dtype(self) -> str | None:
        """``float32`` / ``float16`` / ``bfloat16`` for a file whose weights are stored so
        (``general.file_type``); None for quantised files and files that do not say."""
        return FILE_TYPE_DTYPES.get(self.values.get("general.file_type"))  # type: ignore[arg-type]

    def checkpoint_config(self) -> dict[str, Any]:
        """What a ``config.json`` would say, in its key names (absent keys: not in the file)."""
        config: dict[str, Any] = {}
        if (n := self.context_length()) is not None:
            config["max_position_embeddings"] = n
        if (eos := self.eos_token_id()) is not None:
            config["eos_token_id"] = eos
        if (dtype := self.dtype()) is not None:
            config["dtype"] = dtype
        return config


class _Reader:
    """Reads values at an offset of the file's memory map (nothing is copied but the values)."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.size = buf, path, len(buf)
        self.pos = 0
        self.order = "<"

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what} at byte {self.pos} (not a readable GGUF file)")

    def skip(self, n: int) -> int:
        """Advance ``n`` bytes; returns where they start."""
        start = self.pos
        if n < 0 or start + n > self.size:
            raise self.fail(f"{n} bytes would run past the end of the file ({self.size} bytes)")
        self.pos = start + n
        return start

    def scalar(self, fmt: str) -> Any:
        start = self.skip(struct.calcsize(fmt))
        return struct.unpack_from(self.order + fmt, self.buf, start)[0]

    def string(self) -> str:
        n = self.scalar("Q")
        start = self.skip(n)
        return self.buf[start : start + n].decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int, max_array: int | None) -> tuple[Any, str]:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype]), TYPE_NAMES[vtype]
        if vtype == _STRING:
            return self.string(), "string"
        if vtype == _ARRAY:
            item = self.scalar("I")
            count = self.scalar("Q")
            if item not in TYPE_NAMES:
                raise self.fail(f"unknown array item type {item}")
            name = f"array[{TYPE_NAMES[item]}]"
            if count > self.size:  # every item takes at least one byte
                raise self.fail(f"an array of {count} items in a file of {self.size} bytes")
            if max_array is not None and count > max_array:
                self.skip_array(item, count)
                return GGUFArray(TYPE_NAMES[item], count), name
            return [self.value(item, max_array)[0] for _ in range(count)], name
        raise self.fail(f"unknown value type {vtype}")

    def skip_array(self, item: int, count: int) -> None:
        if item in _SCALARS:
            self.skip(struct.calcsize(_SCALARS[item]) * count)
        elif item == _STRING:
            length = struct.Struct(self.order + "Q")
            for _ in range(count):
                self.skip(length.unpack_from(self.buf, self.skip(8))[0])
        else:
            for _ in range(count):
                self.value(item, 0)  # nested arrays: skipped likewise


def read_gguf_metadata(path: str | os.PathLike[str], *, max_array: int | None = 64) -> GGUFMetadata:
    """The metadata of the GGUF file at ``path``; arrays longer than ``max_array`` are
    kept as :class:`GGUFArray` (``None``: read every array in full)."""
    path = Path(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 4 or f.read(4) != MAGIC:
            raise GGUFError(f"{path}: does not start with the GGUF magic bytes (not a GGUF file)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            r = _Reader(buf, path)
            r.skip(4)
            version = r.scalar("I")
            swapped = struct.unpack(">I", struct.pack("<I", version))[0]
            if version not in (2, 3) and swapped in (2, 3):
                r.order, version = ">", swapped  # a big-endian file
            if version not in (2, 3):
                raise GGUFError(f"{path}: GGUF version {version} is not supported (versions 2 and 3 are)")
            tensors = r.scalar("Q")
            n_kv = r.scalar("Q")
            if n_kv > r.size:
                raise r.fail(f"{n_kv} key/value pairs in a file of {r.size} bytes")
            meta = GGUFMetadata(path=path, version=version, tensor_count=tensors)
            for _ in range(n_kv):
                key = r.string()
                vtype = r.scalar("I")
                meta.values[key], meta.types[key] = r.value(vtype, max_array)
    return meta
