"""The core's /dev/shm row transport (genlm_vllm's workers and genlm serve's clients use
it), without an engine: the buffer, the fallback when it cannot be used, cleanup."""

from __future__ import annotations

import os

import numpy as np
import torch

from genlm_core.engine.row_transport import RowBuffer, forget, write_block, write_rows


def test_rows_through_the_buffer_and_bytes_when_it_cannot_be_used() -> None:
    rows = [torch.randn(7), None, torch.randn(7)]
    buf = RowBuffer("unit")
    try:
        buf.ensure(3 * 7 * 4)
        reply = write_rows(rows, buf.describe())
        assert reply["shm"] and reply["present"] == [True, False, True] and reply["width"] == 7
        got = buf.rows(3, 7)
        assert torch.equal(got[0], rows[0]) and torch.equal(got[2], rows[2])  # bit-exact copies

        # a file of the same name without our nonce (another node's /dev/shm): bytes
        foreign = {**buf.describe(), "nonce": bytes(16)}
        reply = write_rows(rows, foreign)
        assert "shm" not in reply and reply["bytes"][1] is None
        assert torch.equal(torch.frombuffer(bytearray(reply["bytes"][2]), dtype=torch.float32), rows[2])

        # rows wider than the buffer: bytes, never a write past its end
        wide = [torch.randn(1000)]
        assert "bytes" in write_rows(wide, buf.describe())
        buf.ensure(1000 * 4)  # grows; a worker re-maps the larger file
        assert write_rows(wide, buf.describe())["shm"] and torch.equal(buf.rows(1, 1000)[0], wide[0])
    finally:
        forget(buf.name)
        buf.close()
    assert not os.path.exists(buf.path)
    # a buffer that is gone (the backend closed): bytes, not an error
    assert "bytes" in write_rows(rows, buf.describe())
    buf.close()  # idempotent


def test_buffers_of_dead_backends_are_swept_live_ones_kept() -> None:
    """A backend killed without close() (e.g. a Ray actor ended by ray.kill) leaves its
    buffer; the next backend on the machine removes it, never a live one's."""
    import fcntl
    import subprocess

    from genlm_core.engine.row_transport import SHM_DIR, sweep_stale_buffers

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    stale = os.path.join(SHM_DIR, f"genlm-vllm-{gone.pid}-unit-stale")
    held = os.path.join(SHM_DIR, f"genlm-vllm-{gone.pid}-unit-held")  # its owner: another pid namespace
    live = RowBuffer("unit-live")
    fds = []
    try:
        live.ensure(64)
        for path in (stale, held):
            fds.append(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        fcntl.flock(fds[1], fcntl.LOCK_SH)
        os.close(fds.pop(0))
        removed = sweep_stale_buffers()
        assert os.path.basename(stale) in removed and not os.path.exists(stale)
        assert os.path.exists(held) and os.path.exists(live.path)
    finally:
        for fd in fds:
            os.close(fd)
        for path in (stale, held):
            if os.path.exists(path):
                os.unlink(path)
        live.close()


def test_a_block_goes_through_the_buffer_only_when_it_is_the_readers() -> None:
    """genlm serve's writer: one (n, width) block, bit-exact; nothing written (False)
    for a foreign nonce, a block larger than the buffer, a name outside /dev/shm's
    genlm files, or a buffer that is gone; no mapping is kept."""
    from genlm_core.engine import row_transport

    rows = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    buf = RowBuffer("unit-block", owner="remote")
    try:
        buf.ensure(rows.nbytes)
        assert write_block(rows, buf.describe())
        assert torch.equal(buf.rows(3, 5), torch.from_numpy(rows))
        assert buf.name not in row_transport._OPEN  # no mapping left behind
        assert not write_block(rows, {**buf.describe(), "nonce": bytes(16)})
        assert not write_block(np.zeros((100, 100), np.float32), buf.describe())
        assert not write_block(rows, {**buf.describe(), "name": "../etc/passwd"})
        assert not write_block(rows.astype(np.float64), buf.describe())
    finally:
        buf.close()
    assert not write_block(rows, buf.describe())


def test_unknown_owner_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="owner"):
        RowBuffer("x", owner="someone")
