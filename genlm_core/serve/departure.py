"""A request whose client disconnects stops waiting for its work.

Starlette does not cancel a handler whose client went away: the rows of a client killed
mid-request would still be computed, batch after batch. :func:`unless_departed` races the
work against the connection's end (the ASGI ``http.disconnect`` that follows a fully read
body) and cancels the work when the client leaves first. Cancelling a wait on the
backend's batcher takes its contexts out of the queue, so they are dropped at the next
batch boundary (a forward pass already running finishes: it cannot be interrupted).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any

from starlette.requests import ClientDisconnect, Request

__all__ = ["departure", "unless_departed"]


async def departure(request: Request) -> None:
    """Returns when the client has gone (its body was read: what comes now is the end)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        if message["type"] == "http.request" and not message.get("more_body", False):
            await asyncio.Future()  # a server that repeats the last chunk: cannot tell


async def unless_departed(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s result; if the client disconnects first, ``work`` is cancelled (its
    requests leave the batcher's queue: dropped at the next batch boundary) and
    ``ClientDisconnect`` is raised."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(departure(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        watch.cancel()
    if task.cancelled():
        raise ClientDisconnect()
    return task.result()
