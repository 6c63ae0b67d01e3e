"""vLLM's own cleanup of the segments its killed processes leave, and the CPU core split,
without an engine (the row buffer itself: tests/test_row_transport.py in the core)."""

from __future__ import annotations

import os


def test_cpu_ranks_get_disjoint_core_lists(monkeypatch) -> None:
    from genlm_vllm.launch import cpu_binding

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 5})
    assert cpu_binding(2) == "0,1|2,3"  # 5 cores for 2 ranks: 2 each, one left over
    assert cpu_binding(5) == "0|1|2|3|5"
    # fewer cores than ranks (vLLM's "auto" refuses: one NUMA node per rank): one core
    # each, round-robin, so two ranks share core 0
    assert cpu_binding(6) == "0|1|2|3|5|0"


def test_an_engines_leftover_communicator_segments_are_removed() -> None:
    """What a killed worker leaves of vLLM's CPU communicator: only that engine's
    segments go, another engine's (another ident) stay."""
    import secrets

    from genlm_vllm.transport import remove_engine_segments

    from genlm_core.engine.row_transport import SHM_DIR

    ours, theirs = f"vllm_dist_{secrets.token_hex(8)}", f"vllm_dist_{secrets.token_hex(8)}"
    names = [f"{ours}-tp:0-[0-1]-cpushm_0", f"{ours}-pp:0-[0-1]-cpushm_1", f"{theirs}-tp:0-[0-1]-cpushm_0"]
    for n in names:
        with open(os.path.join(SHM_DIR, n), "wb") as f:
            f.write(b"x")
    try:
        assert sorted(remove_engine_segments((), [ours])) == sorted(names[:2])
        assert os.path.exists(os.path.join(SHM_DIR, names[2]))
        assert remove_engine_segments([], []) == [] and remove_engine_segments(["../etc"], ["../etc"]) == []
    finally:
        for n in names:
            if os.path.exists(os.path.join(SHM_DIR, n)):
                os.unlink(os.path.join(SHM_DIR, n))


def test_segments_an_engine_maps_are_found_and_only_those_removed() -> None:
    """An engine's processes map its message queues (Python shared memory) and the
    executor's lock (a named semaphore, mapped under glibc's temporary name: found by
    inode): once such a process is killed they are left over, and removed; other names
    (another program's file) stay."""
    import secrets
    import signal
    import subprocess
    import sys
    import textwrap

    from genlm_vllm.transport import mapped_segments, remove_engine_segments

    from genlm_core.engine.row_transport import SHM_DIR

    queue, other = f"psm_unit{secrets.token_hex(4)}", f"unit-other-{secrets.token_hex(4)}"
    for n in (queue, other):
        with open(os.path.join(SHM_DIR, n), "wb") as f:
            f.write(bytes(4096))
    code = f"""
        import mmap, multiprocessing, os, sys
        maps = [mmap.mmap(os.open(os.path.join({SHM_DIR!r}, n), os.O_RDWR), 4096) for n in ({queue!r}, {other!r})]
        lock = multiprocessing.get_context("spawn").Lock()
        print("sem." + lock._semlock.name.lstrip("/"), flush=True)
        sys.stdin.read()
        """
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # its resource tracker complains about the killed lock
        text=True,
    )
    try:
        sem = holder.stdout.readline().strip()
        seen = mapped_segments([holder.pid])
        assert {queue, other, sem} <= seen, seen
        holder.send_signal(signal.SIGKILL)  # a killed worker: nothing of its own is removed
        holder.wait(timeout=30)
        assert mapped_segments([holder.pid]) == set()
        removed = remove_engine_segments(seen)
        assert queue in removed and other not in removed  # not a kind an engine creates: kept
        assert os.path.exists(os.path.join(SHM_DIR, other))
        assert not os.path.exists(os.path.join(SHM_DIR, queue)) and not os.path.exists(
            os.path.join(SHM_DIR, sem)
        )
    finally:
        holder.kill()
        for n in (queue, other):
            if os.path.exists(os.path.join(SHM_DIR, n)):
                os.unlink(os.path.join(SHM_DIR, n))
