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
(the wire costs more than the pass there). When every active client is
waiting, all are released in the same loop iteration and the batcher's tick policy puts
them in one batch. A lone client never waits (it is the only active one); a client that
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

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _someone_missing(self, now: float) -> bool:
        missing = False
        for client, seen in list(self.last_seen.items()):
            if now - seen > self.window_s and self.waiting[client] == 0:
                del self.last_seen[client]  # went quiet
            elif self.waiting[client] == 0:
                missing = True
        return missing

    async def arrive(self, client: str | None) -> None:
        """Hold ``client``'s request (bounded, see the module) until the other active
        clients' requests are here too; then it counts as computing until :meth:`leave`."""
        if client is None:
            return
        start = time.monotonic()
        self.last_seen[client] = start
        self.waiting[client] += 1
        self._notify()
        waited = False
        entered = self.generation
        try:
            while self.wait_s > 0 and self.generation == entered:
                now = time.monotonic()
                if not self._someone_missing(now):
                    break
                if self.computing == 0:
                    budget = min(self.wait_s, self.busy_share * self.last_busy_s)
                    left = max(start, self.idle_since) + budget - now
                    if left <= 0:
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
        self._notify()

    def stats(self) -> dict[str, float]:
        now = time.monotonic()
        return {
            "wait_s": self.wait_s,
            "active_clients": sum(1 for t in self.last_seen.values() if now - t <= self.window_s),
            "last_busy_s": self.last_busy_s,
            "held_requests": self.held,
            "mean_hold_s": self.held_s / self.held if self.held else 0.0,
        }
