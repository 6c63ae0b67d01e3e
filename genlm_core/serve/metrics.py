"""What a server reports: ``/v1/stats`` (JSON) and ``/metrics`` (the Prometheus text format).

Both read the same counters (:class:`ServerCounters`, kept by the application, and the
backend's own ``stats()``): requests, errors and refusals per client, requests in flight,
the batcher's queue depth, rows per forward pass, the forward passes' share of the time,
per-phase and per-endpoint latency histograms (:mod:`genlm_core.serve.phases`), cache hit
rates and the shared-memory segments. ``/metrics`` is rendered with ``prometheus_client``
from a collector that reads them at scrape time (nothing is registered globally: several
servers may live in one process).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from genlm_core.serve.phases import LATENCY_BUCKETS, PHASES, ForwardClock, Histogram

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.serve.bodies import OpenBodies
    from genlm_core.serve.gather import Gatherer
    from genlm_core.serve.shm import SegmentServer

__all__ = ["ServerCounters", "prometheus_text", "server_stats"]

#: distinct clients whose refusals are kept apart (more are counted under "other")
MAX_CLIENT_LABELS = 64


class ServerCounters:
    """Counters of one server (updated on its event loop)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.inflight = 0
        self.computing: Counter[str] = Counter()  # requests of each peer being computed
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.rows: Counter[str] = Counter()
        self.bytes_out: Counter[str] = Counter()
        self.rejections: Counter[tuple[str, str]] = Counter()  # (reason, client)
        self.latency: dict[str, Histogram] = {}
        self.phases = {p: Histogram(LATENCY_BUCKETS) for p in PHASES}
        self.forwards = ForwardClock()

    def reject(self, reason: str, client: str) -> None:
        known = {c for _, c in self.rejections}
        if client not in known and len(known) >= MAX_CLIENT_LABELS:
            client = "other"
        self.rejections[(reason, client)] += 1

    def observe_latency(self, endpoint: str, seconds: float) -> None:
        hist = self.latency.get(endpoint)
        if hist is None:
            hist = self.latency[endpoint] = Histogram(LATENCY_BUCKETS)
        hist.observe(seconds)


def _cache_rates(backend_stats: dict[str, Any]) -> dict[str, dict[str, float]]:
    out = {}
    for name, value in backend_stats.items():
        if isinstance(value, dict) and "hits" in value and "misses" in value:
            looked = value["hits"] + value["misses"]
            out[name] = {
                "hits": value["hits"],
                "misses": value["misses"],
                "rate": value["hits"] / looked if looked else 0.0,
            }
    return out


def server_stats(
    backend: Any,
    counters: ServerCounters,
    gatherer: "Gatherer",
    segments: "SegmentServer",
    bodies: "OpenBodies | None" = None,
) -> dict[str, Any]:
    """Everything ``/v1/stats`` answers (and ``/metrics`` renders)."""
    c = counters
    uptime = time.time() - c.started
    rejections: dict[str, dict[str, int]] = {}
    for (reason, client), n in c.rejections.items():
        rejections.setdefault(reason, {})[client] = n
    out: dict[str, Any] = {
        "uptime_s": uptime,
        "inflight_requests": c.inflight,
        "open_requests": c.inflight + (len(bodies) if bodies is not None else 0),
        "bodies": bodies.stats() if bodies is not None else {"open": 0, "bytes": 0, "dropped": {}},
        "rejected_busy": sum(n for (reason, _), n in c.rejections.items() if reason == "busy"),
        "rejections": rejections,
        "requests": dict(c.requests),
        "errors": dict(c.errors),
        "rows": dict(c.rows),
        "bytes_out": dict(c.bytes_out),
        "gather": gatherer.stats(),
        "forward": {**c.forwards.stats(), "busy_share": c.forwards.busy_s / uptime if uptime > 0 else 0.0},
        "phases": {p: h.as_dict() for p, h in c.phases.items()},
        "latency": {e: h.as_dict() for e, h in c.latency.items()},
        "shm": segments.stats(),
    }
    batcher = getattr(backend, "batcher", None)
    if batcher is not None:
        out["queue_depth"] = batcher.pending_count()
        sizes = list(batcher.stats.batch_sizes[-1000:])
        out["batch_sizes"] = {
            "recent": len(sizes),
            "mean": float(np.mean(sizes)) if sizes else 0.0,
            "max": max(sizes, default=0),
            "histogram": {str(k): v for k, v in sorted(Counter(sizes).items())},
        }
    backend_stats = backend.stats() if hasattr(backend, "stats") else {}
    out["backend"] = backend_stats
    rates = _cache_rates(backend_stats)
    out["cache_hit_rate"] = {name: r["rate"] for name, r in rates.items()}
    out["caches"] = rates
    return out


def _histogram(family: Any, labels: list[str], hist: dict[str, Any]) -> None:
    from prometheus_client.utils import floatToGoString

    buckets = [(floatToGoString(float(le)), n) for le, n in hist["buckets"].items()]
    family.add_metric(labels, buckets=buckets, sum_value=hist["sum"])


def prometheus_text(stats: dict[str, Any]) -> tuple[bytes, str]:
    """``stats`` (from :func:`server_stats`) in the Prometheus text format, and its media type."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    def families() -> list[Any]:
        out: list[Any] = []

        def gauge(name: str, doc: str, value: float) -> None:
            out.append(GaugeMetricFamily(f"genlm_serve_{name}", doc, value=value))

        def counter(name: str, doc: str, label: str, values: dict[str, float]) -> None:
            fam = CounterMetricFamily(f"genlm_serve_{name}", doc, labels=[label])
            for key, value in sorted(values.items()):
                fam.add_metric([str(key)], value)
            out.append(fam)

        gauge("uptime_seconds", "seconds since the server started", stats["uptime_s"])
        gauge("inflight_requests", "requests being computed (their bodies read)", stats["inflight_requests"])
        gauge("open_requests", "requests being read or computed", stats["open_requests"])
        gauge("open_bodies", "request bodies being read", stats["bodies"]["open"])
        gauge("open_body_bytes", "bytes of the request bodies being read", stats["bodies"]["bytes"])
        gauge("queue_depth", "contexts waiting in the backend's batcher", stats.get("queue_depth", 0))
        gauge(
            "active_clients", "clients that sent a rows request recently", stats["gather"]["active_clients"]
        )
        gauge("shm_segments", "shared-memory row segments held by clients", stats["shm"]["segments"])
        counter("requests", "requests per endpoint", "endpoint", stats["requests"])
        counter("errors", "error answers per kind (HTTP status or cause)", "kind", stats["errors"])
        counter("rows", "rows answered per transport", "transport", stats["rows"])
        counter("bytes_out", "reply bytes per endpoint", "endpoint", stats["bytes_out"])
        counter(
            "bodies_dropped",
            "request bodies dropped (HTTP 408): stalled (idle), too slow (whole), to make room (room)",
            "reason",
            stats["bodies"]["dropped"],
        )
        rej = CounterMetricFamily(
            "genlm_serve_rejections", "requests refused, per reason and client", labels=["reason", "client"]
        )
        for reason, clients in sorted(stats["rejections"].items()):
            for client, n in sorted(clients.items()):
                rej.add_metric([reason, client], n)
        out.append(rej)
        fwd = stats["forward"]
        out.append(CounterMetricFamily("genlm_serve_forward_passes", "forward passes", value=fwd["passes"]))
        out.append(
            CounterMetricFamily(
                "genlm_serve_forward_seconds", "seconds spent in forward passes", value=fwd["busy_s"]
            )
        )
        rows = HistogramMetricFamily("genlm_serve_forward_rows", "rows per forward pass")
        _histogram(rows, [], fwd["rows_per_pass"])
        out.append(rows)
        lat = HistogramMetricFamily(
            "genlm_serve_request_seconds", "request latency per endpoint", labels=["endpoint"]
        )
        for endpoint, hist in sorted(stats["latency"].items()):
            _histogram(lat, [endpoint], hist)
        out.append(lat)
        ph = HistogramMetricFamily(
            "genlm_serve_phase_seconds",
            "time of a rows request in each phase on the server",
            labels=["phase"],
        )
        for phase, hist in stats["phases"].items():
            _histogram(ph, [phase], hist)
        out.append(ph)
        rate = GaugeMetricFamily("genlm_serve_cache_hit_ratio", "hits / lookups per cache", labels=["cache"])
        hits = CounterMetricFamily("genlm_serve_cache_hits", "cache hits", labels=["cache"])
        misses = CounterMetricFamily("genlm_serve_cache_misses", "cache misses", labels=["cache"])
        for name, r in sorted(stats["caches"].items()):
            rate.add_metric([name], r["rate"])
            hits.add_metric([name], r["hits"])
            misses.add_metric([name], r["misses"])
        out += [rate, hits, misses]
        return out

    class _Collector:
        def collect(self) -> list[Any]:
            return families()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return generate_latest(registry), CONTENT_TYPE_LATEST
