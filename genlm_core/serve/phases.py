"""Where a request's time goes on the server: monotonic timestamps, histograms, forward passes.

Every ``/v1/logprobs`` request is stamped with ``time.monotonic()`` (one clock for every
process of a host, so a client on the same host can place the stamps on its own timeline)
at each boundary of its way through the server::

    entry    the handler starts (request line and headers parsed)
    decoded  the body is read, decoded and checked
    released the gatherer let it go (genlm_core.serve.gather)
    rows     its rows are back from the backend
    encoded  its rows are in the client's segment or in the reply frame

and :class:`ForwardClock` stamps every forward pass (the backend's batch function:
start, end, rows). The phases are the differences: ``read`` (entry -> decoded), ``held``
(-> released), ``queued`` (-> the first forward pass that started after it was released),
``computing`` (-> the last such pass's end), ``delivered`` (-> rows), ``encoding``
(-> encoded). The ROWS reply carries the stamps (``"t"``), the server keeps histograms
of the phases (``/v1/stats``, ``/metrics``). A stamp costs ~50 ns.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "LATENCY_BUCKETS",
    "PHASES",
    "ROUND_TRIP",
    "ROWS_BUCKETS",
    "ForwardClock",
    "Histogram",
    "RequestClock",
    "round_trip_phases",
]

#: seconds; the upper bounds of latency histograms (Prometheus' ``le``)
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: rows per forward pass
ROWS_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512)
PHASES = ("read", "held", "queued", "computing", "delivered", "encoding")


class Histogram:
    """Counts per bucket (not cumulative), their sum and count. Thread-safe enough for
    counters: each observation is one locked update."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last: above every bound
        self.sum = 0.0
        self.count = 0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = 0
        for i, bound in enumerate(self.buckets):  # noqa: B007 - a dozen bounds
            if value <= bound:
                break
        else:
            i = len(self.buckets)
        with self._lock:
            self.counts[i] += 1
            self.sum += value
            self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``[(le, count <= le), ..., (inf, count)]``, as Prometheus writes them."""
        out, total = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts):
            total += n
            out.append((bound, total))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "sum": self.sum,
            "mean": self.sum / self.count if self.count else 0.0,
            "buckets": {("+Inf" if b == float("inf") else f"{b:g}"): n for b, n in self.cumulative()},
        }


class ForwardClock:
    """Stamps every forward pass of a backend: wraps its batcher's ``batch_fn``
    (called in the batcher's thread). Keeps the recent passes for attributing them to
    requests, a histogram of rows per pass and the total busy time."""

    def __init__(self, keep: int = 512) -> None:
        self.recent: deque[tuple[float, float, int]] = deque(maxlen=keep)
        self.rows = Histogram(ROWS_BUCKETS)
        self.busy_s = 0.0
        self.passes = 0
        self._lock = threading.Lock()

    def wrap(self, batch_fn: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        def timed(requests: list[Any]) -> Any:
            start = time.monotonic()
            try:
                return batch_fn(requests)
            finally:
                self.record(start, time.monotonic(), len(requests))

        timed.__wrapped__ = batch_fn  # type: ignore[attr-defined]
        return timed

    def install(self, backend: Any) -> bool:
        """Wrap ``backend.batcher.batch_fn`` (once). False for a backend without a batcher."""
        batcher = getattr(backend, "batcher", None)
        if batcher is None or not callable(getattr(batcher, "batch_fn", None)):
            return False
        if not hasattr(batcher.batch_fn, "__wrapped__"):
            batcher.batch_fn = self.wrap(batcher.batch_fn)
        return True

    def record(self, start: float, end: float, rows: int) -> None:
        with self._lock:
            self.recent.append((start, end, rows))
            self.busy_s += end - start
            self.passes += 1
        self.rows.observe(rows)

    def passes_between(self, after: float, before: float) -> list[tuple[float, float, int]]:
        """The passes that started at or after ``after`` and ended by ``before``."""
        with self._lock:
            return [p for p in self.recent if p[0] >= after and p[1] <= before]

    def stats(self) -> dict[str, Any]:
        return {"passes": self.passes, "busy_s": self.busy_s, "rows_per_pass": self.rows.as_dict()}


class RequestClock:
    """The stamps of one request (see the module docstring)."""

    __slots__ = ("entry", "decoded", "released", "rows", "encoded", "first_start", "last_end")

    def __init__(self) -> None:
        self.entry = time.monotonic()
        self.decoded = self.released = self.rows = self.encoded = 0.0
        self.first_start = self.last_end = 0.0

    def stamp(self, name: str) -> None:
        setattr(self, name, time.monotonic())

    def attribute(self, clock: ForwardClock) -> None:
        """Which forward passes were this request's: those between its release and its rows."""
        passes = clock.passes_between(self.released, self.rows)
        if passes:
            self.first_start, self.last_end = passes[0][0], passes[-1][1]
        else:  # every row came from a cache: no pass of its own
            self.first_start = self.last_end = self.released

    def phases(self) -> dict[str, float]:
        return {
            "read": self.decoded - self.entry,
            "held": self.released - self.decoded,
            "queued": self.first_start - self.released,
            "computing": self.last_end - self.first_start,
            "delivered": self.rows - self.last_end,
            "encoding": self.encoded - self.rows,
        }

    def stamps(self) -> dict[str, float]:
        """For the ROWS header: absolute monotonic seconds."""
        return {
            "entry": self.entry,
            "decoded": self.decoded,
            "released": self.released,
            "first_start": self.first_start,
            "last_end": self.last_end,
            "rows": self.rows,
            "encoded": self.encoded,
        }


#: a round trip seen from a client on the server's host, in order (they tile its time)
ROUND_TRIP = (
    "client_encode",
    "request_transport",
    *PHASES,
    "response_transport",
    "client_decode",
)


def round_trip_phases(
    start: float, sent: float, received: float, done: float, stamps: dict[str, float] | None
) -> dict[str, float]:
    """A client's round trip cut at its own stamps (``start`` encoding, ``sent`` the
    request, ``received`` the reply, ``done`` decoding it) and the server's (the ROWS
    frame's ``t``; same host: one monotonic clock). Without the server's stamps the
    time between sending and receiving is all ``request_transport``."""
    out = dict.fromkeys(ROUND_TRIP, 0.0)
    out["client_encode"] = sent - start
    out["client_decode"] = done - received
    names = ("entry", "decoded", "released", "first_start", "last_end", "rows", "encoded")
    if not stamps or not set(names) <= stamps.keys() or not sent <= stamps["entry"] <= received:
        out["request_transport"] = received - sent
        return out
    s = {k: float(v) for k, v in stamps.items()}
    cuts = [s[name] for name in names]
    out["request_transport"] = s["entry"] - sent
    for phase, a, b in zip(PHASES, cuts, cuts[1:]):
        out[phase] = b - a
    out["response_transport"] = received - s["encoded"]
    return out
