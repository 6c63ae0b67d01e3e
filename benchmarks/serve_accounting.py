"""Where a step of bench_serve's layouts (b) and (c) goes: the clients' round-trip phases
(genlm-remote's ``stats()["transport"]["timing"]``, cut at the client's and the server's
stamps) and the server's forward passes (its ``/v1/stats`` before and after a layout).
Standard library only."""

from __future__ import annotations

from typing import Any

__all__ = ["ACCOUNTING_COLS", "accounting", "accounting_rows"]


def _bucket_counts(hist: dict[str, Any]) -> dict[str, int]:
    """Per-bucket counts (``le`` -> observations in that bucket) of a cumulative histogram."""
    out, below = {}, 0
    for le, total in hist["buckets"].items():
        out[le] = total - below
        below = total
    return out


def accounting(
    results: list[dict[str, Any]], before: dict[str, Any], after: dict[str, Any]
) -> dict[str, Any]:
    """Where a layout's cycle went (see the module docstring): per step, in ms."""
    trips = sum(r["transport"]["timing"]["round_trips"] for r in results)
    phases: dict[str, float] = {}
    for r in results:
        for phase, seconds in r["transport"]["timing"]["seconds"].items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    spans = sum(r["end"] - r["start"] for r in results)
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    out: dict[str, Any] = {"round_trips": trips}
    # the cycle throughput sees: the layout's span over one client's steps
    out["cycle_ms"] = 1e3 * span * len(results) / trips
    per_step = {phase: 1e3 * seconds / trips for phase, seconds in phases.items()}
    # the client's own time between its round trips: its program (masking, sampling: most
    # of it torch.multinomial over the vocabulary), its batcher, its particles resuming
    per_step["client"] = 1e3 * (spans - sum(phases.values())) / trips
    out["per_step_ms"] = per_step
    # the parts tile each client's own span; against the layout's cycle they fall short by
    # the clients' staggered starts and ends
    out["accounted"] = sum(per_step.values()) / out["cycle_ms"]
    fb, fa = before["forward"], after["forward"]
    passes = fa["passes"] - fb["passes"]
    rows_b, rows_a = _bucket_counts(fb["rows_per_pass"]), _bucket_counts(fa["rows_per_pass"])
    out["server"] = {
        "forward_passes": passes,
        "rows_per_pass_mean": (fa["rows_per_pass"]["sum"] - fb["rows_per_pass"]["sum"]) / max(1, passes),
        "rows_per_pass_histogram": {
            le: rows_a[le] - rows_b.get(le, 0) for le in rows_a if rows_a[le] - rows_b.get(le, 0)
        },
        "forward_share": (fa["busy_s"] - fb["busy_s"]) / span,
        "forward_ms_per_pass": 1e3 * (fa["busy_s"] - fb["busy_s"]) / max(1, passes),
    }
    # the cycle if no request waited for another's pass: the client's own work, the wire
    # and one pass of the measured length (no held, queued or computing beyond it); a
    # floor only while the server has room (passes a cycle x their length <= the cycle)
    wire = sum(per_step.get(p, 0.0) for p in WIRE)
    out["unwaited_cycle_ms"] = per_step["client"] + wire + out["server"]["forward_ms_per_pass"]
    return out


#: the phases of a round trip that are neither waiting nor computing
WIRE = (
    "client_encode",
    "request_transport",
    "read",
    "delivered",
    "encoding",
    "response_transport",
    "client_decode",
)


ACCOUNTING_COLS = [
    "layout",
    "cycle_ms",
    "unwaited_cycle_ms",
    "client",
    "client_encode",
    "request_transport",
    "read",
    "held",
    "queued",
    "computing",
    "delivered",
    "encoding",
    "response_transport",
    "client_decode",
    "accounted",
    "rows_per_pass",
    "forward_share",
]


def accounting_rows(layouts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One table row per layout: the cycle and its parts (ms per step), the share of the
    cycle they account for, rows per pass, forward share."""
    rows = []
    for name, acc in layouts.items():
        row = {
            "layout": name,
            "cycle_ms": acc["cycle_ms"],
            "unwaited_cycle_ms": acc.get("unwaited_cycle_ms"),
            **acc["per_step_ms"],
            "accounted": acc["accounted"],
        }
        row["rows_per_pass"] = acc["server"]["rows_per_pass_mean"]
        row["forward_share"] = acc["server"]["forward_share"]
        rows.append(row)
    return rows
