"""genlm_core.serve.gather: the requests of several active clients are released
together (one batch), a lone client never waits, and every hold is bounded."""

from __future__ import annotations

import asyncio
import time

import pytest

from genlm_core.serve.gather import Gatherer


async def _timed(g: Gatherer, client: str) -> float:
    t0 = time.monotonic()
    await g.arrive(client)
    return time.monotonic() - t0


@pytest.mark.asyncio
async def test_a_lone_client_never_waits() -> None:
    g = Gatherer(wait_s=5.0)
    for _ in range(3):
        assert await _timed(g, "a") < 1.0  # 5 s if it waited
        g.leave("a")
    assert g.stats()["held_requests"] == 0


@pytest.mark.asyncio
async def test_a_missing_client_is_waited_for_a_quarter_pass_at_most_wait_s() -> None:
    g = Gatherer(wait_s=0.2, window_s=30.0)
    await g.arrive("b")
    await asyncio.sleep(2.0)  # b's batch: a 2 s pass
    g.leave("b")  # b is active, but sends nothing more
    took = await _timed(g, "a")  # min(0.2, 2.0 / 4): 0.2 s
    assert 0.15 <= took < 5.0
    g.leave("a")


@pytest.mark.asyncio
async def test_waiting_requests_are_released_together_when_all_clients_are_here() -> None:
    """b and c arrive while a's 2 s batch runs: held; when it ends they wait (up to a
    quarter of it) for a's next request, and all three go in the same loop iteration."""
    g = Gatherer(wait_s=10.0, window_s=60.0)
    await g.arrive("a")  # alone: not held
    released: list[str] = []

    async def one(c: str) -> None:
        await g.arrive(c)
        released.append(c)

    tb, tc = asyncio.create_task(one("b")), asyncio.create_task(one("c"))
    await asyncio.sleep(2.0)
    assert released == []  # held while a's batch runs
    g.leave("a")
    await asyncio.sleep(0.05)
    assert released == []  # waiting for a's next request (up to 0.5 s)
    t0 = time.monotonic()
    await one("a")
    await asyncio.gather(tb, tc)
    assert sorted(released) == ["a", "b", "c"] and time.monotonic() - t0 < 0.4
    assert g.computing == 3


@pytest.mark.asyncio
async def test_requests_are_held_while_a_batch_runs_then_join_the_next() -> None:
    """a's request arrives while b's batch is computing: holding it costs nothing (it
    could not run before), so it waits for b's next request instead of running alone."""
    g = Gatherer(wait_s=1.0, window_s=30.0)
    await g.arrive("b")  # b computing
    task = asyncio.create_task(g.arrive("a"))
    await asyncio.sleep(1.5)  # beyond wait_s: a is still held, b's batch still runs
    assert not task.done()
    g.leave("b")
    await asyncio.sleep(0.01)
    assert not task.done()  # waiting for b to come back (up to wait_s)
    await g.arrive("b")
    await asyncio.wait_for(task, 5.0)
    assert g.computing == 2


@pytest.mark.asyncio
async def test_quiet_clients_and_anonymous_requests() -> None:
    g = Gatherer(wait_s=5.0, window_s=0.1)
    await g.arrive("b")
    g.leave("b")
    await asyncio.sleep(0.2)  # b went quiet: no longer waited for
    assert await _timed(g, "a") < 1.0
    assert await _timed(g, None) < 0.1 and g.computing == 1  # anonymous: not counted
    assert Gatherer(wait_s=0).wait_s == 0


@pytest.mark.asyncio
async def test_the_wait_is_a_quarter_of_the_forward_pass() -> None:
    """After a busy period of 0.8 s a request waits up to 0.2 s for a missing client (not
    wait_s = 30 s); after a pass of ~0 s it does not wait."""
    g = Gatherer(wait_s=30.0, window_s=60.0)
    await g.arrive("b")
    await asyncio.sleep(0.8)
    g.leave("b")  # b is active; its 0.8 s batch just ended
    assert g.last_busy_s >= 0.75
    took = await _timed(g, "a")
    assert 0.15 <= took < 5.0
    g.leave("a")
    await g.arrive("b")
    g.leave("b")  # a pass of no time: nothing to gain by waiting
    assert await _timed(g, "a") < 1.0


async def _pass(g: Gatherer, client: str, busy_s: float) -> None:
    await g.arrive(client)
    await asyncio.sleep(busy_s)
    g.leave(client)


@pytest.mark.asyncio
async def test_a_client_due_after_the_bound_is_not_waited_for() -> None:
    """b takes 1.2 s between a reply and its next request; after b's 0.8 s pass the bound
    is 0.2 s, so b is not due in time: a runs at once instead of waiting 0.2 s for nothing
    (decided on the turnaround, not on a clock reading: held_requests stays 0)."""
    g = Gatherer(wait_s=30.0, window_s=60.0)
    await _pass(g, "b", 0.05)
    await asyncio.sleep(1.2)
    await _pass(g, "b", 0.8)  # b's turnaround: ~1.2 s; the last pass: 0.8 s
    assert g.turnaround["b"] >= 1.15
    await g.arrive("a")
    st = g.stats()
    assert st["held_requests"] == 0 and st["released_none_due"] == 1
    g.leave("a")


@pytest.mark.asyncio
async def test_a_client_due_within_the_bound_is_waited_for() -> None:
    """b comes back 0.05 s after each reply, within the bound (a quarter of its 2 s pass):
    a waits for it and both go together."""
    g = Gatherer(wait_s=30.0, window_s=60.0)
    await _pass(g, "b", 0.05)
    await asyncio.sleep(0.05)
    await _pass(g, "b", 2.0)
    released: list[str] = []

    async def one(c: str) -> None:
        await g.arrive(c)
        released.append(c)

    ta = asyncio.create_task(one("a"))
    await asyncio.sleep(0.05)
    assert released == []  # a waits for b
    await one("b")
    await asyncio.wait_for(ta, 5.0)
    assert sorted(released) == ["a", "b"] and g.stats()["held_requests"] == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("wait_s", [0.0, 5.0])
async def test_ids_of_quiet_clients_are_forgotten(wait_s: float) -> None:
    """Client ids are the clients' to choose: a local user sending a fresh id with every
    request must not grow the gatherer's per-client state, gathering on or off."""
    g = Gatherer(wait_s=wait_s, window_s=0.05)
    for i in range(300):
        await g.arrive(f"id-{i}")
        g.leave(f"id-{i}")
        if i % 100 == 99:
            await asyncio.sleep(0.1)  # every id so far went quiet
    await asyncio.sleep(0.1)
    await g.arrive("last")
    g.leave("last")
    assert len(g.last_seen) <= 100 and len(g.left_at) <= 100 and len(g.turnaround) <= 100
    assert "id-0" not in g.left_at and not g.waiting


@pytest.mark.asyncio
async def test_a_client_gone_quiet_past_its_due_time_is_not_waited_for() -> None:
    """b came back 0.05 s after each reply, then stopped (closed, paused, its program
    ended) but is still active (window_s = 60 s). Once it is later than its due time by
    more than the bound and four deviations, a's request runs at once: without this every
    other client's request waited the full bound until b left the window."""
    g = Gatherer(wait_s=30.0, window_s=60.0)
    for _ in range(3):
        await _pass(g, "b", 0.05)
        await asyncio.sleep(0.05)
    await _pass(g, "b", 0.4)  # the bound: a quarter of 0.4 s
    await asyncio.sleep(2.0)  # b is ~1.95 s overdue; its allowance is well under 1 s
    await g.arrive("a")
    st = g.stats()
    assert st["held_requests"] == 0 and st["released_overdue"] == 1
    g.leave("a")


@pytest.mark.asyncio
async def test_a_client_late_within_the_bound_is_still_waited_for() -> None:
    """b's turnaround is 0.05 s and it is 0.15 s late when a arrives: later than its due
    time, but by less than the bound (a quarter of b's 2 s pass), so a waits for it and
    both go together."""
    g = Gatherer(wait_s=30.0, window_s=60.0)
    await _pass(g, "b", 0.05)
    await asyncio.sleep(0.05)
    await _pass(g, "b", 2.0)
    await asyncio.sleep(0.2)
    ta = asyncio.create_task(g.arrive("a"))
    await asyncio.sleep(0.05)
    assert not ta.done()  # held for b
    await g.arrive("b")
    await asyncio.wait_for(ta, 5.0)
    st = g.stats()
    assert st["held_requests"] == 1 and st["released_overdue"] == 0 and g.computing == 2
