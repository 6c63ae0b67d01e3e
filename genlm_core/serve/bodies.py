"""Request bodies being read: the bytes must keep coming, and all of them together are capped.

A body is read chunk by chunk. Each chunk must arrive within ``body_idle_s`` of the one
before (of the request's start, for the first): the gap counts between reads, as nginx's
``client_body_timeout``, so a large body on a slow link is read and a stalled one is
dropped. The whole body must arrive within ``body_timeout_s``. A body that misses either
gets HTTP 408 and its connection is closed.

What is read at once is capped over all clients, not per peer address (a local client
may connect from any address of 127.0.0.0/8): at most ``max_open_bodies`` bodies of at
most ``max_open_body_bytes`` together. A request that needs room when they are full
takes it from the body that has been idle longest (a 408 to that one: it was sending
nothing), so no number of stalled connections, from whatever addresses, keeps a client
that sends its body from being read.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from genlm_core.serve.inputs import HTTPError
from genlm_core.serve.limits import ServeLimits

__all__ = ["OpenBodies", "read_body"]


@dataclass(eq=False)
class _Body:
    timer: asyncio.Timeout  # its read's deadline: moved on by each chunk, brought forward to drop it
    last: float  # loop time of its last chunk (of its start, before the first)
    size: int = 0
    dropped: bool = False  # to make room for another


class OpenBodies:
    """The request bodies being read, over all clients (used on the server's event loop)."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self._open: set[_Body] = set()
        self.bytes = 0
        self.dropped: Counter[str] = Counter()  # why: "idle", "whole" (body_timeout_s), "room"

    def __len__(self) -> int:
        return len(self._open)

    def open(self, timer: asyncio.Timeout, now: float) -> _Body:
        """Register a body about to be read; the idlest others are dropped to make room."""
        while len(self._open) >= self.max_count:
            self._drop_idlest(None)
        body = _Body(timer, now)
        self._open.add(body)
        return body

    def grow(self, body: _Body, n: int) -> None:
        """``n`` more bytes of ``body`` are held; the idlest others are dropped while the
        total is above ``max_bytes`` (one body alone fits: ``max_body_bytes`` is lower)."""
        if body not in self._open:
            return  # dropped: its deadline is now
        body.size += n
        self.bytes += n
        while self.bytes > self.max_bytes and len(self._open) > 1:
            self._drop_idlest(body)

    def close(self, body: _Body) -> None:
        if body in self._open:
            self._open.remove(body)
            self.bytes -= body.size

    def _drop_idlest(self, keep: _Body | None) -> None:
        victim = min((b for b in self._open if b is not keep), key=lambda b: b.last)
        self.close(victim)
        if not victim.timer.expired():  # not timing out already: its read ends now, a 408
            victim.dropped = True
            victim.timer.reschedule(asyncio.get_running_loop().time())

    def stats(self) -> dict[str, Any]:
        return {"open": len(self._open), "bytes": self.bytes, "dropped": dict(self.dropped)}


async def read_body(request: Any, limits: ServeLimits, bodies: OpenBodies) -> bytes:
    """The whole body: each chunk within ``limits.body_idle_s`` of the last, all of it
    within ``limits.body_timeout_s`` and ``limits.max_body_bytes``, read as one of
    ``bodies``. HTTP 408 (the connection closed) or 413 otherwise."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise HTTPError(
            413, f"request body of {declared} bytes is above the server's limit of {limits.max_body_bytes}"
        )
    loop = asyncio.get_running_loop()
    start = loop.time()
    whole = start + limits.body_timeout_s
    chunks, total = [], 0
    body: _Body | None = None
    try:
        async with asyncio.timeout(min(whole, start + limits.body_idle_s)) as timer:
            body = bodies.open(timer, start)
            try:
                async for chunk in request.stream():
                    if not chunk:
                        continue
                    total += len(chunk)
                    if total > limits.max_body_bytes:
                        raise HTTPError(
                            413, f"request body is above the server's limit of {limits.max_body_bytes} bytes"
                        )
                    bodies.grow(body, len(chunk))
                    chunks.append(chunk)
                    if not body.dropped:  # (a dropped body's deadline stays: now)
                        body.last = loop.time()
                        timer.reschedule(min(whole, body.last + limits.body_idle_s))
            finally:
                bodies.close(body)
    except TimeoutError:
        why = _why_late(body, timer, whole, total, declared, limits, bodies)
        raise HTTPError(408, why, "RequestTimeout", {"connection": "close"}) from None
    return b"".join(chunks)


def _why_late(
    body: _Body | None,
    timer: asyncio.Timeout,
    whole: float,
    total: int,
    declared: str | None,
    limits: ServeLimits,
    bodies: OpenBodies,
) -> str:
    got = f"got {total} of {declared} bytes" if declared else f"got {total} bytes"
    if body is not None and body.dropped:
        bodies.dropped["room"] += 1
        return (
            f"the request body was dropped to make room ({got}): the server was reading its limit of "
            f"request bodies (--max-open-bodies {limits.max_open_bodies}, --max-open-body-bytes "
            f"{limits.max_open_body_bytes}) and this one had waited longest for its next byte; send the "
            "body without pauses, or raise those limits"
        )
    if (timer.when() or 0.0) >= whole:
        bodies.dropped["whole"] += 1
        return (
            f"the request body did not arrive within {limits.body_timeout_s:g} s ({got}); "
            "send it whole, or start the server with a longer --body-timeout-s"
        )
    bodies.dropped["idle"] += 1
    return (
        f"no byte of the request body arrived for {limits.body_idle_s:g} s ({got}); send the body "
        "without pauses, or start the server with a longer --body-idle-s"
    )
