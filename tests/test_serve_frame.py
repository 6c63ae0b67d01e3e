"""The wire frame of genlm serve (genlm_core.serve.frame): round trips are exact, and the
strict parser answers every truncated, extended or corrupted frame with a FrameError
(a ValueError) - never another exception, never a hang (hypothesis fuzzes it)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genlm_core.serve import frame
from genlm_core.serve.frame import FrameError

contexts_st = st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=12), max_size=8)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _any_decode(data: bytes) -> None:
    """Every decoder on ``data``: each must return or raise FrameError."""
    for decode in (frame.decode_contexts, frame.decode_rows, frame.vocab_from_frame, frame.parse):
        try:
            decode(data)
        except FrameError:
            pass


@FUZZ
@given(contexts_st, st.booleans())
def test_contexts_round_trip(contexts, uncached) -> None:
    shm = ["0123456789abcdef" * 2, "f" * 32]
    req = frame.decode_contexts(frame.encode_contexts(contexts, uncached=uncached, shm=shm))
    assert req.contexts == [tuple(c) for c in contexts] and req.uncached == uncached
    assert req.shm == shm


def _contexts_with(shm: object) -> bytes:
    return frame._build(
        frame.CONTEXTS, {"n": 1, "uncached": False, "shm": shm}, [b"\x01\0\0\0", b"\x05\0\0\0"]
    )


def test_segment_handles_are_checked_and_older_shm_headers_ask_for_nothing() -> None:
    """An older client names a /dev/shm file: it gets the frame (no handles), never an
    error; handles that are not a short list of 32-character strings are refused."""
    old = {"name": "genlm-remote-1-x", "nonce": "00" * 16, "capacity": 64}
    assert frame.decode_contexts(_contexts_with(old)).shm == []
    assert frame.decode_contexts(_contexts_with(None)).shm == []
    for bad in (
        "x",
        {"handles": "a" * 32},
        {"handles": ["a" * 31]},
        {"handles": [1]},
        {"handles": ["a" * 32] * 9},
    ):
        with pytest.raises(FrameError, match="shm"):
            frame.decode_contexts(_contexts_with(bad))


def test_rows_from_row_tensors_with_stamps_taken_last() -> None:
    """A list of row tensors is copied straight into the frame, bit for bit; a callable
    header field is read after the copy (the server's last stamp)."""
    import torch

    rows = [torch.randn(7) for _ in range(3)]
    order = []
    data = frame.encode_rows(rows, 3, 7, replica="h:1", t=lambda: order.append("t") or {"encoded": 2.5})
    reply = frame.decode_rows(data)
    assert order == ["t"] and reply.stamps == {"encoded": 2.5} and reply.replica == "h:1"
    assert reply.rows.tobytes() == torch.stack(rows).numpy().tobytes()
    shm = frame.decode_rows(frame.encode_rows(None, 3, 7, "shm", segment="a" * 32, shm_socket="@x"))
    assert shm.transport == "shm" and shm.segment == "a" * 32 and shm.rows is None
    with pytest.raises(FrameError, match="names its segment"):
        frame.decode_rows(frame.encode_rows(None, 3, 7, "shm"))


def test_copy_rows_takes_tensors_arrays_and_mixed_rows() -> None:
    """copy_rows writes every kind of row bit for bit (the oracle: each row's own bytes)."""
    import torch

    rows = [torch.randn(5), np.arange(5, dtype=np.float32), torch.randn(5, dtype=torch.float64)]
    dst = np.empty((3, 5), dtype=np.float32)
    frame.copy_rows(dst, rows)
    want = np.stack([np.asarray(r, dtype=np.float32) for r in rows])
    assert dst.tobytes() == want.tobytes()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_on_a_gpu_come_over_in_one_transfer_bit_for_bit(dtype) -> None:  # pragma: no cover - GPU only
    """GPU rows are stacked and copied once: the same bytes as each row copied alone."""
    import torch

    rows = [torch.randn(50, device="cuda").to(getattr(torch, dtype)) for _ in range(9)]
    reply = frame.decode_rows(frame.encode_rows(rows, 9, 50))
    want = np.stack([r.float().cpu().numpy() for r in rows])
    assert reply.rows.tobytes() == want.tobytes()


@FUZZ
@given(st.integers(0, 5), st.integers(0, 40), st.binary(min_size=0, max_size=800))
def test_rows_round_trip_bit_for_bit(n, width, noise) -> None:
    raw = (
        (noise * (4 * n * width // max(len(noise), 1) + 1))[: 4 * n * width]
        if noise
        else bytes(4 * n * width)
    )
    rows = np.frombuffer(raw, dtype="<f4").reshape(n, width).astype(np.float32)  # any bits: NaNs, infs
    reply = frame.decode_rows(bytes(frame.encode_rows(rows, n, width)))
    assert reply.rows is not None and reply.rows.tobytes() == rows.tobytes() and reply.rows.flags.writeable


@FUZZ
@given(st.lists(st.binary(max_size=6), min_size=1, max_size=20), st.data())
def test_vocab_round_trip(tokens, data) -> None:
    strs = [data.draw(st.text(max_size=4)) for _ in tokens]
    assert frame.vocab_from_frame(frame.encode_vocab(tokens, strs)) == (tokens, strs)


def _valid_frames() -> list[bytes]:
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    return [
        frame.encode_contexts([[1, 2, 3], [4]], shm=["1" * 32]),
        bytes(frame.encode_rows(rows, 3, 4, t={"entry": 1.0})),
        bytes(frame.encode_rows(None, 3, 4, "shm", segment="1" * 32)),
        frame.encode_vocab([b"a", b"\xff\xfe"], ["a", "?"]),
    ]


@pytest.mark.parametrize("index", range(4))
def test_every_truncation_and_extension_is_a_frame_error(index) -> None:
    data = _valid_frames()[index]
    for cut in range(len(data)):
        with pytest.raises(FrameError):
            frame.parse(data[:cut])
    with pytest.raises(FrameError, match="length mismatch"):
        frame.parse(data + b"\x00")


@FUZZ
@given(
    st.sampled_from(range(4)), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6)
)
def test_corrupted_frames_parse_or_fail_cleanly(index, flips) -> None:
    data = bytearray(_valid_frames()[index])
    for pos, value in flips:
        data[pos % len(data)] = value
    _any_decode(bytes(data))


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_fail_cleanly(data) -> None:
    _any_decode(data)
    _any_decode(frame.MAGIC + data)


@FUZZ
@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.dictionaries(
        st.sampled_from(["n", "width", "uncached", "shm", "dtype", "transport"]),
        st.none() | st.integers() | st.text(max_size=3) | st.booleans(),
    ),
)
def test_lying_headers_fail_cleanly_without_huge_allocations(n, width, header) -> None:
    """Counts far beyond the payload (n = 2**32 - 1) are refused by arithmetic before
    anything of that size is allocated."""
    for kind in (frame.CONTEXTS, frame.ROWS, frame.VOCAB):
        h = {**header, "n": n, "width": width}
        body = frame._build(kind, h, [b"\x00" * 16])
        _any_decode(body)


def test_errors_name_the_problem() -> None:
    good = bytes(frame.encode_rows(np.zeros((1, 2), np.float32), 1, 2))
    bad_version = good[:4] + struct.pack("<H", 99) + good[6:]
    with pytest.raises(FrameError, match="version 99 is not supported"):
        frame.parse(bad_version)
    with pytest.raises(FrameError, match="not a genlm frame"):
        frame.parse(b"XXXX" + good[4:])
    with pytest.raises(FrameError, match="expected a CONTEXTS frame, got ROWS"):
        frame.decode_contexts(good)
    with pytest.raises(FrameError, match="above the limit 2"):
        frame.decode_contexts(frame.encode_contexts([[1], [2], [3]]), max_batch=2)
    assert issubclass(FrameError, ValueError)
