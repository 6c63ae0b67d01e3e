"""The wire frame of ``genlm serve``: contexts in, float32 rows out, versioned.

Every binary body (request or response) is one frame, little-endian::

    offset  size  field
    0       4     magic  b"GLMF"
    4       2     version (1)
    6       2     kind   (1 CONTEXTS, 2 ROWS, 3 VOCAB)
    8       4     header_len: bytes of the header, padded with spaces to a multiple of 8
    12      4     reserved, 0
    16      8     payload_len
    24      ...   header: a UTF-8 JSON object of small metadata (counts, flags)
    24+h    ...   payload

Payloads (never JSON numbers, never an object per token):

* ``CONTEXTS`` (client -> server): header ``{"n": N, "uncached": bool, "shm": null |
  {"handles": [hex, ...]}}`` (the shared-memory segments this client holds, one per server
  process it talks to: :mod:`genlm_core.serve.shm`; any other ``shm`` object, such as
  the ``/dev/shm`` file names of older clients, asks for nothing and is answered with
  the rows in the frame); payload ``N`` uint32 lengths, then every context's token ids
  as int32, concatenated.
* ``ROWS`` (server -> client): header ``{"n": N, "width": W, "dtype": "float32",
  "transport": "frame" | "shm", "replica": "host:pid", "segment": hex, "shm_socket":
  "@name", "t": {stamp: seconds}}`` (``segment``: the handle the rows were written to;
  ``shm_socket``: where a client that asked for shared memory gets a segment of this
  server process; ``t``: the server's monotonic stamps, :mod:`genlm_core.serve.phases`);
  payload ``N * W`` float32 (row-major), or nothing when the rows are in a segment.
* ``VOCAB`` (server -> client, once): header ``{"n": N}``; payload ``N`` uint32 byte
  lengths, ``N`` uint32 string lengths, then every token's bytes, then every token's
  string form (UTF-8), so the client rebuilds ``byte_vocab``/``str_vocab`` exactly.

The parser is strict: a frame whose magic, version, kind, lengths, header fields or
payload size do not add up raises :class:`FrameError` (a ``ValueError``) naming what
is wrong; it never reads past the buffer and its work is bounded by the buffer's size.
Errors travel as JSON (``{"error": ..., "type": ...}``) with an HTTP status, not frames.

Version policy: a reader accepts only the versions in :data:`SUPPORTED_VERSIONS`; a
change to any layout above is a new version, and a server answers a frame of a
version it does not know with a clear 400 error naming the versions it speaks.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CONTEXTS",
    "FrameError",
    "MAGIC",
    "ROWS",
    "SUPPORTED_VERSIONS",
    "VERSION",
    "VOCAB",
    "Frame",
    "decode_contexts",
    "decode_rows",
    "vocab_from_frame",
    "encode_contexts",
    "encode_rows",
    "encode_vocab",
    "parse",
    "row_array",
    "copy_rows",
]

MAGIC = b"GLMF"
VERSION = 1
SUPPORTED_VERSIONS = (1,)
CONTEXTS, ROWS, VOCAB = 1, 2, 3
KINDS = {CONTEXTS: "CONTEXTS", ROWS: "ROWS", VOCAB: "VOCAB"}
_PREFIX = struct.Struct("<4sHHIIQ")
PREFIX_LEN = _PREFIX.size  # 24
#: the largest header a reader accepts (headers hold a few counts and flags)
MAX_HEADER = 64 * 1024
MEDIA_TYPE = "application/x-genlm-frame"


class FrameError(ValueError):
    """A frame that cannot be read: the message says which field and what was expected."""


@dataclass(frozen=True)
class Frame:
    kind: int
    header: dict[str, Any]
    payload: memoryview


def _build(
    kind: int, header: dict[str, Any], payload_parts: list[bytes | memoryview], head: bytes | None = None
) -> bytes:
    if head is None:
        head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    payload_len = sum(memoryview(p).nbytes for p in payload_parts)
    return b"".join([_PREFIX.pack(MAGIC, VERSION, kind, len(head), 0, payload_len), head, *payload_parts])


def parse(data: bytes | bytearray | memoryview, expect: int | None = None) -> Frame:
    """The frame in ``data`` (exactly one, nothing after it), or :class:`FrameError`."""
    buf = memoryview(data).cast("B")
    if len(buf) < PREFIX_LEN:
        raise FrameError(f"truncated frame: {len(buf)} bytes, shorter than the {PREFIX_LEN}-byte prefix")
    magic, version, kind, header_len, reserved, payload_len = _PREFIX.unpack_from(buf, 0)
    if magic != MAGIC:
        raise FrameError(f"not a genlm frame: magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version not in SUPPORTED_VERSIONS:
        raise FrameError(
            f"frame version {version} is not supported (this side speaks {list(SUPPORTED_VERSIONS)}): "
            "upgrade the older of client and server"
        )
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind} (known: {KINDS})")
    if expect is not None and kind != expect:
        raise FrameError(f"expected a {KINDS[expect]} frame, got {KINDS[kind]}")
    if reserved != 0:
        raise FrameError(f"reserved prefix field is {reserved}, must be 0")
    if header_len > MAX_HEADER or header_len % 8:
        raise FrameError(f"header length {header_len} must be a multiple of 8 and <= {MAX_HEADER}")
    if PREFIX_LEN + header_len + payload_len != len(buf):
        raise FrameError(
            f"frame length mismatch: prefix says {PREFIX_LEN} + {header_len} header + {payload_len} "
            f"payload bytes, got {len(buf)} (truncated or trailing data)"
        )
    try:
        header = json.loads(bytes(buf[PREFIX_LEN : PREFIX_LEN + header_len]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise FrameError(f"frame header is not a UTF-8 JSON object: {exc}") from None
    if not isinstance(header, dict):
        raise FrameError(f"frame header must be a JSON object, got {type(header).__name__}")
    return Frame(kind, header, buf[PREFIX_LEN + header_len :])


def _count(header: dict[str, Any], key: str, limit: int | None = None) -> int:
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FrameError(f"frame header field {key!r} must be a non-negative int, got {value!r}")
    if limit is not None and value > limit:
        raise FrameError(f"frame header field {key!r} is {value}, above the limit {limit}")
    return value


# ---------------------------------------------------------------------- CONTEXTS
def encode_contexts(
    contexts: list[tuple[int, ...]] | list[list[int]], *, uncached: bool = False, shm: list[str] | None = None
) -> bytes:
    """``shm``: the handles of the segments this client holds (None or empty: rows in the frame)."""
    lengths = np.fromiter((len(c) for c in contexts), dtype="<u4", count=len(contexts))
    ids = np.fromiter((t for c in contexts for t in c), dtype="<i4", count=int(lengths.sum()))
    header: dict[str, Any] = {"n": len(contexts), "uncached": bool(uncached), "shm": None}
    if shm:
        header["shm"] = {"handles": list(shm)}
    return _build(CONTEXTS, header, [lengths.tobytes(), ids.tobytes()])


#: most segment handles one request names, and the length of one
MAX_HANDLES, HANDLE_LEN = 8, 32


@dataclass(frozen=True)
class ContextsRequest:
    contexts: list[tuple[int, ...]]
    uncached: bool
    shm: list[str]  # segment handles (empty: rows in the frame)


def _handles(shm: Any) -> list[str]:
    if shm is None:
        return []
    if not isinstance(shm, dict):
        raise FrameError("frame header field 'shm' must be null or {\"handles\": [hex, ...]}")
    handles = shm.get("handles")
    if handles is None:
        return []  # an older client's /dev/shm file: answered with the frame
    if (
        not isinstance(handles, list)
        or len(handles) > MAX_HANDLES
        or not all(isinstance(h, str) and len(h) == HANDLE_LEN for h in handles)
    ):
        raise FrameError(
            f"frame header field 'shm.handles' must be a list of at most {MAX_HANDLES} "
            f"{HANDLE_LEN}-character hex handles"
        )
    return handles


def decode_contexts(data: bytes, max_batch: int | None = None) -> ContextsRequest:
    frame = parse(data, expect=CONTEXTS)
    h = frame.header
    n = _count(h, "n", max_batch)
    uncached = h.get("uncached", False)
    if not isinstance(uncached, bool):
        raise FrameError(f"frame header field 'uncached' must be a bool, got {uncached!r}")
    shm = _handles(h.get("shm"))
    payload = frame.payload
    if len(payload) < 4 * n:
        raise FrameError(f"CONTEXTS payload holds {len(payload)} bytes, fewer than {n} lengths")
    lengths = np.frombuffer(payload, dtype="<u4", count=n).astype(np.int64)
    total = int(lengths.sum())
    if len(payload) != 4 * n + 4 * total:
        raise FrameError(
            f"CONTEXTS payload is {len(payload)} bytes; {n} lengths summing to {total} tokens "
            f"need {4 * n + 4 * total}"
        )
    ids = np.frombuffer(payload, dtype="<i4", count=total, offset=4 * n).tolist()
    contexts, pos = [], 0
    for length in lengths.tolist():
        contexts.append(tuple(ids[pos : pos + length]))
        pos += length
    return ContextsRequest(contexts, uncached, shm)


# ---------------------------------------------------------------------- ROWS
#: bytes reserved for a ROWS header built after its payload (the stamps are taken last)
ROWS_HEADER_ROOM = 1024


def row_array(row: Any) -> np.ndarray:
    """A row (float32 tensor on any device, or array) as a float32 CPU array, without a
    copy when it is one already."""
    if isinstance(row, np.ndarray):
        return row
    row = row.detach()
    if row.device.type != "cpu" or str(row.dtype) != "torch.float32":
        row = row.to("cpu").float()
    return row.numpy()


def copy_rows(dst: np.ndarray, rows: Any) -> None:
    """Copy ``rows`` (tensors on any device, or arrays, of ``dst``'s width) into the float32
    array ``dst`` ``(len(rows), width)``. Rows on an accelerator are gathered there and
    copied to ``dst`` in one transfer (one wait for the device, where a transfer per row
    waits for it once a row); the others are copied one by one (no copy before that)."""
    first = rows[0] if len(rows) else None
    device = getattr(first, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu" and len(rows) > 1:
        import torch

        if all(isinstance(r, torch.Tensor) and r.device == device for r in rows):
            torch.from_numpy(dst).copy_(torch.stack([r.detach() for r in rows]).to(torch.float32))
            return
    for i, row in enumerate(rows):
        np.copyto(dst[i], row_array(row))


def encode_rows(
    rows: Any,
    n: int,
    width: int,
    transport: str = "frame",
    replica: str | None = None,
    **extra: Any,
) -> memoryview:
    """A ROWS frame. ``rows``: ``n`` rows of ``width`` floats (a ``(n, width)`` array or a
    list of row tensors/arrays; None with ``transport="shm"``), copied once, straight into
    the frame. ``extra``: further header fields (``segment``, ``shm_socket``, ``t``);
    a callable value is called after the payload is copied (a stamp taken last)."""

    def header() -> bytes:
        h: dict[str, Any] = {"n": n, "width": width, "dtype": "float32", "transport": transport}
        if replica is not None:
            h["replica"] = replica
        for key, value in extra.items():
            h[key] = value() if callable(value) else value
        return json.dumps(h, separators=(",", ":")).encode()

    if transport == "shm":
        return memoryview(_build(ROWS, {}, [], head=header()))
    assert rows is not None and len(rows) == n
    payload = 4 * n * width
    out = np.empty(PREFIX_LEN + ROWS_HEADER_ROOM + payload, dtype=np.uint8)
    view = out[PREFIX_LEN + ROWS_HEADER_ROOM :].view("<f4").reshape(n, width)
    copy_rows(view, rows)
    del view
    head = header()
    if len(head) > ROWS_HEADER_ROOM:
        raise ValueError(f"ROWS header of {len(head)} bytes exceeds its room of {ROWS_HEADER_ROOM}")
    out[:PREFIX_LEN] = np.frombuffer(
        _PREFIX.pack(MAGIC, VERSION, ROWS, ROWS_HEADER_ROOM, 0, payload), np.uint8
    )
    out[PREFIX_LEN : PREFIX_LEN + ROWS_HEADER_ROOM] = np.frombuffer(
        head + b" " * (ROWS_HEADER_ROOM - len(head)), np.uint8
    )
    return memoryview(out)


@dataclass(frozen=True)
class RowsReply:
    n: int
    width: int
    transport: str
    rows: np.ndarray | None  # (n, width) float32, writable; None for "shm"
    replica: str | None = None
    segment: str | None = None
    shm_socket: str | None = None
    stamps: dict[str, float] | None = None


def decode_rows(data: bytes | memoryview, max_width: int | None = None) -> RowsReply:
    frame = parse(data, expect=ROWS)
    h = frame.header
    n, width = _count(h, "n"), _count(h, "width", max_width)
    if h.get("dtype") != "float32":
        raise FrameError(f"ROWS dtype must be 'float32', got {h.get('dtype')!r}")
    transport = h.get("transport")
    extra = {k: h.get(k) for k in ("replica", "segment", "shm_socket")}
    for key, value in extra.items():
        if value is not None and not isinstance(value, str):
            raise FrameError(f"ROWS {key} must be a string, got {value!r}")
    stamps = h.get("t")
    if stamps is not None and not (
        isinstance(stamps, dict) and all(isinstance(v, (int, float)) for v in stamps.values())
    ):
        raise FrameError("ROWS t must be an object of numbers")
    if transport == "shm":
        if len(frame.payload):
            raise FrameError("a ROWS frame with transport 'shm' carries no payload")
        if extra["segment"] is None:
            raise FrameError("a ROWS frame with transport 'shm' names its segment")
        return RowsReply(n, width, "shm", None, stamps=stamps, **extra)
    if transport != "frame":
        raise FrameError(f"ROWS transport must be 'frame' or 'shm', got {transport!r}")
    if len(frame.payload) != 4 * n * width:
        raise FrameError(
            f"ROWS payload is {len(frame.payload)} bytes; {n} x {width} float32 need {4 * n * width}"
        )
    rows = np.frombuffer(frame.payload, dtype="<f4").reshape(n, width).astype(np.float32, copy=True)
    return RowsReply(n, width, "frame", rows, stamps=stamps, **extra)


# ---------------------------------------------------------------------- VOCAB
def encode_vocab(byte_vocab: list[bytes], str_vocab: list[str]) -> bytes:
    if len(byte_vocab) != len(str_vocab):
        raise ValueError(f"{len(byte_vocab)} byte tokens but {len(str_vocab)} strings")
    strs = [s.encode("utf-8", errors="surrogatepass") for s in str_vocab]
    blens = np.fromiter((len(b) for b in byte_vocab), dtype="<u4", count=len(byte_vocab))
    slens = np.fromiter((len(s) for s in strs), dtype="<u4", count=len(strs))
    return _build(VOCAB, {"n": len(byte_vocab)}, [blens.tobytes(), slens.tobytes(), *byte_vocab, *strs])


def vocab_from_frame(data: bytes) -> tuple[list[bytes], list[str]]:
    frame = parse(data, expect=VOCAB)
    n = _count(frame.header, "n")
    payload = frame.payload
    if len(payload) < 8 * n:
        raise FrameError(f"VOCAB payload holds {len(payload)} bytes, fewer than {n} pairs of lengths")
    blens = np.frombuffer(payload, dtype="<u4", count=n).astype(np.int64)
    slens = np.frombuffer(payload, dtype="<u4", count=n, offset=4 * n).astype(np.int64)
    total = 8 * n + int(blens.sum()) + int(slens.sum())
    if len(payload) != total:
        raise FrameError(f"VOCAB payload is {len(payload)} bytes; its lengths add up to {total}")
    raw = bytes(payload[8 * n :])
    out_b, out_s, pos = [], [], 0
    for length in blens.tolist():
        out_b.append(raw[pos : pos + length])
        pos += length
    try:
        for length in slens.tolist():
            out_s.append(raw[pos : pos + length].decode("utf-8", errors="surrogatepass"))
            pos += length
    except UnicodeDecodeError as exc:
        raise FrameError(f"VOCAB string form is not UTF-8: {exc}") from None
    return out_b, out_s
