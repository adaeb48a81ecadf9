"""The top of the report: run description, cost model provenance, verdict and headline cards."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pandas as pd

from lab.report.page import Card, cards_html, fmt, run_description, trace_path
from lab.report.slo import SloResult
from lab.report.stages import completed_requests
from schema.frames import as_float, get_path

MAX_HEADER_PROVENANCE = 220
"""Longer cost-model provenance is cut in the header; the config tables keep it whole."""


def _pair(summary: dict[str, Any], metric: str) -> tuple[str, str]:
    """P50 / P99 of a latency in ms, or in s once P99 reaches 10 s; and the unit."""
    p50 = as_float(get_path(summary, metric, "p50"))
    p99 = as_float(get_path(summary, metric, "p99"))
    if p99 is not None and p99 >= 10_000:
        return f"{fmt(p50 / 1e3 if p50 is not None else None)} / {fmt(p99 / 1e3)}", "s"
    return f"{fmt(p50)} / {fmt(p99)}", "ms"


def _cards(
    summary: dict[str, Any], requests: pd.DataFrame, slo: SloResult, verdict: dict[str, Any]
) -> list[Card]:
    """Headline numbers from the summary; request counts fall back to the requests frame."""
    n = summary.get("num_requests", len(requests))
    completed = summary.get("completed", len(completed_requests(requests)))
    rejected = summary.get("rejected", len(requests) - len(completed_requests(requests)))
    goodput = as_float(get_path(summary, "goodput", "value"))
    if goodput is None:
        goodput = slo.goodput_rps
    targets = [
        f"{name} ≤ {fmt(value, 0)} ms"
        for name, value in (("TTFT", slo.slo_ttft_ms), ("TPOT", slo.slo_tpot_ms))
        if value is not None
    ]
    slo_text = (
        f"{', '.join(targets)}: {100 * slo.meets_both:.0f}% of requests"
        if targets
        else "no SLO targets given"
    )
    ev = verdict["evidence"]
    hit = as_float(summary.get("prefix_hit_rate"))
    return [
        Card(
            "completed",
            f"{fmt(completed, 0)} / {fmt(n, 0)}",
            f"rejected {fmt(rejected, 0)}",
        ),
        Card("request throughput", fmt(summary.get("request_throughput"), 2, "req/s")),
        Card(
            "output throughput",
            fmt(summary.get("output_throughput"), 0, "tok/s"),
            f"input {fmt(summary.get('input_throughput'), 0, 'tok/s')}",
        ),
        Card("goodput", fmt(goodput, 2, "req/s"), slo_text),
        *(
            Card(f"{name} p50 / p99", *_pair(summary, f"{name.lower()}_ms"))
            for name in ("TTFT", "TPOT", "ITL", "E2E")
        ),
        Card("prefix hit rate", "n/a" if hit is None else f"{100 * hit:.1f}%"),
        Card(
            "engine busy",
            "n/a"
            if as_float(ev.get("busy_fraction")) is None
            else f"{100 * ev['busy_fraction']:.0f}%",
            "sum of step time / run duration",
        ),
        Card(
            "duration",
            fmt(ev.get("duration_s"), 1, "s"),
            f"{fmt(summary.get('num_steps', ev.get('num_steps')), 0)} steps; "
            f"wall {fmt(summary.get('wall_s'), 1, 's')}",
        ),
    ]


def header_html(
    summary: dict[str, Any], requests: pd.DataFrame, verdict: dict[str, Any], slo: SloResult
) -> str:
    """Title, run and cost-model lines, the verdict box and the headline cards."""
    trace = Path(trace_path(summary)).name
    cost = summary.get("cost_model") or {}
    provenance = str(cost.get("name") or "")
    if cost.get("profile"):
        provenance += f", profile {cost['profile']}"
    if cost.get("chosen"):
        provenance += f" ({cost['chosen']})"
    if cost.get("provenance"):
        provenance += f": {cost['provenance']}"
    if len(provenance) > MAX_HEADER_PROVENANCE:
        provenance = provenance[: MAX_HEADER_PROVENANCE - 1] + "… (in full under Run configuration)"
    limit = verdict["limit_label"]
    return (
        f"<h1>Where the time goes: {html.escape(trace)}</h1>"
        f"<div class='sub'>{html.escape(run_description(summary))}<br>"
        f"cost model: {html.escape(provenance or 'not given')}</div>"
        f"<div class='verdict'>Binding limit: <b class='limit'>{html.escape(limit)}</b><br>"
        f"{html.escape(verdict['text'])}</div>"
        f"{cards_html(_cards(summary, requests, slo, verdict))}"
    )
