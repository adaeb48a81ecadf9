"""The report of a simulated cluster: which replica the step figures show, and the replicas table.

With several replicas, ``steps.csv`` and ``queues.csv`` carry a ``replica``
column; the timelines and the verdict read one engine's steps, so the report
shows the busiest replica's (highest busy share) and compares all of them in
a table: requests placed, completed, throughput, TTFT P50/P90, prefix hit
rate and busy share, with the router's decisions by reason.
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from lab.report.page import fmt


def cluster_replicas(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-replica summaries of a run with more than one replica (else empty)."""
    replicas = summary.get("replicas")
    return replicas if isinstance(replicas, list) and len(replicas) > 1 else []


def busiest(replicas: list[dict[str, Any]]) -> int:
    return int(max(replicas, key=lambda r: r.get("busy_share") or 0.0)["replica"])


def one_replica(frame: pd.DataFrame, replica: int) -> pd.DataFrame:
    """The rows of ``replica`` (all rows when ``frame`` has no ``replica`` column)."""
    if "replica" not in frame.columns:
        return frame
    return frame[frame["replica"] == replica].drop(columns="replica").reset_index(drop=True)


def replicas_table(summary: dict[str, Any], shown: int) -> str:
    """One row per replica (the one the figures show highlighted), then the router's line."""

    def pct(x: Any) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    head = (
        "<tr><th>replica</th><th>requests</th><th>completed</th><th>rejected</th>"
        "<th>req/s</th><th>output tok/s</th><th>TTFT P50 (ms)</th><th>TTFT P90 (ms)</th>"
        "<th>prefix hit rate</th><th>busy share</th></tr>"
    )
    rows = []
    for r in cluster_replicas(summary):
        ttft = r.get("ttft_ms") or {}
        cells = [
            str(r["replica"]),
            fmt(r["requests"], 0),
            fmt(r["completed"], 0),
            fmt(r["rejected"], 0),
            fmt(r["request_throughput"], 2),
            fmt(r["output_throughput"], 0),
            fmt(ttft.get("p50")),
            fmt(ttft.get("p90")),
            pct(r.get("prefix_hit_rate")),
            pct(r.get("busy_share")),
        ]
        picked = ' class="picked"' if r["replica"] == shown else ""
        rows.append(f"<tr{picked}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    router = summary.get("router") or {}
    decisions = ", ".join(f"{k} {v}" for k, v in (router.get("decisions") or {}).items())
    line = (
        f"<p class='note'>router: {html.escape(str(router.get('policy')))} "
        f"(load in {html.escape(str(router.get('load')))}); decisions: "
        f"{html.escape(decisions or 'none')}</p>"
    )
    return f"<table>{head}{''.join(rows)}</table>{line}"
