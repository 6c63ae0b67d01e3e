"""The core's /dev/shm row transport (genlm_vllm's workers and genlm serve's clients use
it), without an engine: the buffer, the fallback when it cannot be used, cleanup."""

from __future__ import annotations

import os

import torch

from genlm_core.engine.row_transport import RowBuffer, forget, write_rows


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


def test_a_writer_opens_only_a_plain_buffer_of_its_own_user(tmp_path) -> None:
    """A symlink or a hard link named like a buffer, whose file starts with the nonce the
    writer was given: the writer sends bytes and the file is untouched."""
    rows = [torch.randn(8)]
    nonce = bytes(range(16))
    target = tmp_path / "victim"
    target.write_bytes(nonce + bytes(4096))
    original = target.read_bytes()
    name = f"genlm-vllm-{os.getpid()}-unit-link"
    link = os.path.join("/dev/shm", name)
    real = RowBuffer("unit-real")
    hard = link + "-hard"
    try:
        os.symlink(target, link)
        reply = write_rows(rows, {"name": name, "nonce": nonce, "capacity": 4096})
        assert "bytes" in reply and target.read_bytes() == original
        real.ensure(64)
        os.link(real.path, hard)  # two links: not a buffer as its reader made it
        reply = write_rows(rows, {"name": os.path.basename(hard), "nonce": real.nonce, "capacity": 64})
        assert "bytes" in reply
        os.unlink(hard)
        assert write_rows(rows, real.describe())["shm"]  # the reader's own: through the buffer
        assert torch.equal(real.rows(1, 8)[0], rows[0])
    finally:
        for path in (link, hard):
            if os.path.lexists(path):
                os.unlink(path)
        forget(real.name)
        forget(name)
        real.close()


def test_unknown_owner_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="owner"):
        RowBuffer("x", owner="someone")
