"""Gathering the requests of several clients into one batch.

A server's backend batches what waits in its AutoBatcher together, but clients that run
in lockstep (each sends its next step's rows when it got the previous ones) fall out of
phase: while one client's batch runs, the others' requests queue and run as the next
batch, and the first client's next request arrives just after that batch started. Four
SIS clients then settle into two forward passes per step (``A | BCD``) where one would
do, and a forward pass that reads its weights once per batch (the LM head of a small
model on a CPU, any model on a GPU) costs nearly the same for 16 rows as for 64.

:class:`Gatherer` holds a request back while some *active* client (one that sent a
rows request in the last ``window_s`` seconds) has no request waiting here, as long as
either a batch is being computed (holding then costs nothing: the request could not run
before that batch ends anyway) or for a bounded time after the request arrived or the
backend went idle, whichever is later: a quarter of the last busy period (the forward
pass), at most ``wait_s``. Waiting a quarter of a pass to save a whole pass is a good bet
when the other clients' turnaround (their particles' own masking and sampling: a few ms
for SmolLM2-sized rows) is shorter than that, and a lost bet costs at most a quarter of a
pass; for a model whose passes take a millisecond it is next to nothing, as it should be
(the wire costs more than the pass there). Once the backend is idle, a request waits only
for the missing clients *expected* within that bound: each client's turnaround (from its
reply to its next request: its own work and the wire) is kept as a moving average, and a
client that is due later than the bound is not waited for at all (waiting would hold the
request for the whole bound and still run it without that client). On a GPU, where a
pass of SmolLM2-135M takes ~9 ms whatever its rows and a client's turnaround ~43 ms, the
bound (a quarter pass) is far shorter than the gaps between out-of-phase clients, and
holding for them cost each step its full bound and gathered nothing
(``benchmarks/bench_gather.py``). A client with no turnaround yet is expected. A client
*overdue* is not: one whose request is later than its due time by more than four times its
turnaround's mean deviation (Jacobson's retransmission timeout, RFC 6298) or than the bound,
whichever is longer - a client that closed, paused or finished its program would otherwise
hold every other client's requests for the bound until ``window_s`` has passed (a client
that started right after another closed had each request held 19.6 ms on the CPU, 0.03 ms
with this rule). When every
active client is waiting, all are released in the same loop iteration and the batcher's
tick policy puts them in one batch. A lone client never waits (it is the only active one); a client that
went quiet stops being waited for after ``window_s``; requests without a client id
(anything but genlm-remote) are not held. ``wait_s=0`` turns it off.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

__all__ = ["Gatherer"]


class Gatherer:
    def __init__(self, wait_s: float, window_s: float = 1.0) -> None:
        self.wait_s = wait_s
        self.window_s = window_s
        self.last_seen: dict[str, float] = {}
        self.waiting: Counter[str] = Counter()
        self.computing = 0
        self.idle_since = time.monotonic()
        self.busy_since = self.idle_since
        self.last_busy_s = 0.0
        #: share of the last busy period a request may wait for the others (see the module)
        self.busy_share = 0.25
        self.generation = 0  # bumped to release every request waiting at that moment, together
        self._changed: asyncio.Event | None = None
        self.held = 0  # requests that waited
        self.held_s = 0.0
        #: when each client's last request was answered, and its turnaround's moving average
        self.left_at: dict[str, float] = {}
        self.turnaround: dict[str, float] = {}
        #: the mean deviation of each client's turnaround from its average (RFC 6298's RTTVAR)
        self.deviation: dict[str, float] = {}
        self.not_expected = 0  # requests released at once: no missing client was due in time
        self.overdue = 0  # of those, the ones where some missing client was overdue
        self._pruned_at = time.monotonic()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _forget_quiet(self, now: float) -> None:
        """Drop the clients that went quiet (a new turnaround if one comes back): client ids
        are the clients' to choose, so nothing kept per id may outlive ``window_s``."""
        self._pruned_at = now
        for client, seen in list(self.last_seen.items()):
            if now - seen > self.window_s and self.waiting[client] == 0:
                del self.last_seen[client]
                self.left_at.pop(client, None)
                self.turnaround.pop(client, None)
                self.deviation.pop(client, None)

    def _missing(self, now: float) -> list[str]:
        """The active clients with no request waiting here (forgetting quiet ones)."""
        self._forget_quiet(now)
        return [c for c in self.last_seen if self.waiting[c] == 0]

    def _expected_by(self, client: str, now: float, deadline: float, budget: float) -> bool | None:
        """Whether ``client``'s next request is due by ``deadline`` (its last reply plus its
        turnaround; a client without both is expected). ``None``: it is overdue (later than
        its due time by more than ``max(4 x deviation, budget)``), so not expected either."""
        left, turn = self.left_at.get(client), self.turnaround.get(client)
        if left is None or turn is None:
            return True
        due = left + turn
        if now - due > max(4.0 * self.deviation.get(client, 0.0), budget):
            return None
        return due <= deadline

    def _note_turnaround(self, client: str, gap: float) -> None:
        """A new turnaround ``gap`` of ``client``: the moving averages of it (gain 1/2) and of
        its deviation (gain 1/4; half the first turnaround to start, as RFC 6298 does)."""
        old = self.turnaround.get(client)
        if old is None:
            self.turnaround[client] = gap
            self.deviation[client] = gap / 2
            return
        self.deviation[client] = 0.75 * self.deviation.get(client, 0.0) + 0.25 * abs(gap - old)
        self.turnaround[client] = 0.5 * (old + gap)

    async def arrive(self, client: str | None) -> None:
        """Hold ``client``'s request (bounded, see the module) until the other active
        clients' requests are here too; then it counts as computing until :meth:`leave`."""
        if client is None:
            return
        start = time.monotonic()
        self.last_seen[client] = start
        left = self.left_at.get(client)
        if left is not None and self.waiting[client] == 0:
            self._note_turnaround(client, start - left)
        self.waiting[client] += 1
        self._notify()
        waited = False
        entered = self.generation
        try:
            while self.wait_s > 0 and self.generation == entered:
                now = time.monotonic()
                missing = self._missing(now)
                if not missing:
                    break
                if self.computing == 0:
                    budget = min(self.wait_s, self.busy_share * self.last_busy_s)
                    deadline = max(start, self.idle_since) + budget
                    left = deadline - now
                    if left <= 0:
                        break
                    expected = [self._expected_by(c, now, deadline, budget) for c in missing]
                    if not any(expected):
                        self.not_expected += 1
                        self.overdue += None in expected
                        break
                else:
                    left = self.window_s  # woken when the running batch ends
                if self._changed is None:
                    self._changed = asyncio.Event()
                waited = True
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    pass
            if self.generation == entered:  # this request ends the wait: release everyone with it
                self.generation += 1
        finally:
            self.waiting[client] -= 1
            if self.waiting[client] <= 0:
                del self.waiting[client]
        if self.computing == 0:
            self.busy_since = time.monotonic()
        self.computing += 1
        self._notify()
        if waited:
            self.held += 1
            self.held_s += time.monotonic() - start

    def leave(self, client: str | None) -> None:
        """``client``'s request is answered (or failed)."""
        if client is None:
            return
        self.computing -= 1
        now = time.monotonic()
        if self.computing == 0:
            self.idle_since = now
            self.last_busy_s = min(now - self.busy_since, 4 * self.window_s)
        self.last_seen[client] = now
        self.left_at[client] = now
        if now - self._pruned_at > self.window_s:  # also when nothing waits (wait_s=0)
            self._forget_quiet(now)
        self._notify()

    def stats(self) -> dict[str, float]:
        now = time.monotonic()
        return {
            "wait_s": self.wait_s,
            "active_clients": sum(1 for t in self.last_seen.values() if now - t <= self.window_s),
            "last_busy_s": self.last_busy_s,
            "held_requests": self.held,
            "mean_hold_s": self.held_s / self.held if self.held else 0.0,
            "released_none_due": self.not_expected,
            "released_overdue": self.overdue,
        }
