"""``capacity.html``: each configuration's capacity, replicas and the limit at the edge, and
its probes: the requests that miss an SLO and the P99 tails against the rate scale."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from lab.report.page import Section, figure_div, write_page
from lab.report.plotlyjs import INLINE, PlotlyJs
from lab.report.plotting import log_axis, tick_text
from lab.report.sweep_page import describe_knobs, rows_table

RATE_SCALE_TITLE = "rate scale (x the trace's arrival rate)"
MISS_FLOOR = 1e-4
"""Where a probe that every request passed is drawn on the log axis of missed requests."""


def _curves(
    capacity: pd.DataFrame, probes: pd.DataFrame, knobs: list[str]
) -> list[tuple[str, pd.DataFrame]]:
    """(configuration name, its probes by rate scale), one curve per configuration (a grid
    over ``replicas`` gives one per replica count)."""
    names = dict(zip(capacity["config_id"], describe_knobs(capacity, knobs), strict=True))
    return [
        (names[config_id], part.sort_values("rate_scale"))
        for config_id, part in probes.groupby("config_id", sort=True)
    ]


def _edge_figure(curves: list[tuple[str, pd.DataFrame]], target: float) -> go.Figure:
    """Requests missing an SLO (1 - attainment) on a log axis, so the edge near the target
    is as visible as the collapse far above it."""
    fig = go.Figure()
    for name, part in curves:
        missed = (1 - part["slo_attainment"]).clip(lower=MISS_FLOOR)
        fig.add_trace(
            go.Scatter(
                x=part["rate_scale"], y=missed, mode="lines+markers", name=name,
                customdata=part["slo_attainment"], text=part["binding_limit"],
                hovertemplate="rate scale %{x:.3g}: attainment %{customdata:.4f}<br>binding "
                "limit %{text}<extra></extra>",
            )
        )  # fmt: skip
    fig.add_hline(y=1 - target, line={"color": "#d62728", "dash": "dash"})
    scales = [part["rate_scale"] for _, part in curves]
    missed = [(1 - part["slo_attainment"]).clip(lower=MISS_FLOOR) for _, part in curves]
    fig.update_xaxes(**log_axis(*scales), title_text=RATE_SCALE_TITLE)
    fig.update_yaxes(
        **log_axis(*missed, [1 - target], percent=True),
        title_text=f"requests missing an SLO (floor {tick_text(MISS_FLOOR, percent=True)})",
    )
    fig.update_layout(height=420, margin={"t": 30, "b": 50, "l": 80, "r": 30})
    return fig


def _tail_figure(
    curves: list[tuple[str, pd.DataFrame]], column: str, slo: float | None, label: str
) -> go.Figure:
    """``column`` (a P99 latency) against the rate scale, with the SLO as a dashed line."""
    fig = go.Figure()
    drawn = [part for _, part in curves if column in part]
    for name, part in curves:
        if column in part:
            fig.add_trace(
                go.Scatter(x=part["rate_scale"], y=part[column], mode="lines+markers", name=name)
            )
    if slo is not None:
        fig.add_hline(y=slo, line={"color": "#d62728", "dash": "dash"})
    fig.update_xaxes(**log_axis(*(p["rate_scale"] for p in drawn)), title_text=RATE_SCALE_TITLE)
    slo_line = [] if slo is None else [slo]
    fig.update_yaxes(**log_axis(*(p[column] for p in drawn), slo_line), title_text=label)
    fig.update_layout(height=360, margin={"t": 30, "b": 50, "l": 80, "r": 30})
    return fig


def _probe_sections(
    curves: list[tuple[str, pd.DataFrame]], target: float, slos: tuple[float | None, float | None]
) -> list[Section]:
    ttft, tpot = slos
    return [
        Section(
            "Attainment at the edge",
            f"Requests that miss an SLO, per probe, on a log axis; dashed: 1 - {target:g}.",
            figure_div(_edge_figure(curves, target)),
        ),
        Section(
            "TTFT and TPOT P99",
            "The tails that decide the attainment, per probe; dashed: the SLOs.",
            figure_div(_tail_figure(curves, "ttft_ms_p99", ttft, "TTFT P99 (ms)"))
            + figure_div(_tail_figure(curves, "tpot_ms_p99", tpot, "TPOT P99 (ms)")),
        ),
    ]


def _columns(table: str) -> dict[str, tuple[str, str]]:
    """``{column: (header, meaning)}`` from rows ``column | header | meaning``; an indented
    line carries on the row above it."""
    rows = re.sub(r"\n +", " ", table.strip()).splitlines()
    return {column: (header, meaning) for column, header, meaning in (r.split(" | ") for r in rows)}


COLUMNS = _columns("""
config_id | config | the configuration's number in capacity.csv
max_rate_scale | max scale | highest passing rate scale (x the trace's rate)
max_request_rate | max req/s | that scale times the trace's mean arrival rate
servers | servers | the servers (GPUs) of the configuration: replicas, or prefill plus decode
max_request_rate_per_server | req/s per server | max req/s over the servers
replicas_even_split | replicas even | replicas the trace's own rate needs with the traffic split
    evenly: ceil(1 / max scale)
replicas_simulated | replicas sim | --replicas-search: the fewest replicas behind the router
    that meet the SLOs (one fewer does not)
replicas_simulated_rate_scale | sim scale | the rate scale of that search
attainment_at_replicas | att. at replicas | SLO attainment with replicas sim
attainment_one_fewer | att. one fewer | SLO attainment with one replica fewer
replicas_simulated_note | replicas note | why the replica search found no count
attainment_at_max | att. at max | SLO attainment at max scale
binding_limit_at_max | limit at max | binding limit at max scale
first_failing_scale | first fail | lowest failing rate scale probed
crossing_scale | crossing | where attainment falls through the target, interpolated between
    probes
binding_limit_above | limit above | binding limit at first fail
ttft_stage_above | TTFT stage above | the stage with the largest share of TTFT at first fail
engine_busy_above | busy above | engine busy share at first fail
ttft_ms_p90_at_max | TTFT P90 ms | P90 TTFT at max scale
tpot_ms_p90_at_max | TPOT P90 ms | P90 TPOT at max scale
probes | probes | replays run by the search
error | error | why the search failed
""")
"""The capacity table's columns: short header and meaning (the legend under the table)."""


def capacity_table_html(capacity: pd.DataFrame, knobs: list[str]) -> str:
    """The capacity table with short headers, leaving out columns empty in every row, and
    its legend."""
    filled = [
        c for c in COLUMNS if c in capacity and (capacity[c].astype(object).fillna("") != "").any()
    ]
    shown = list(dict.fromkeys(["config_id", *knobs, *filled]))
    headers = {c: COLUMNS[c][0] for c in shown if c in COLUMNS}
    legend = "".join(
        f"<dt>{html.escape(short)}</dt><dd><code>{c}</code>: {html.escape(COLUMNS[c][1])}</dd>"
        for c, short in headers.items()
    )
    return rows_table(capacity, shown, headers) + f"<dl class='legend'>{legend}</dl>"


def write_capacity_page(
    out: Path, title: str, subtitle: str, capacity: pd.DataFrame, probes: pd.DataFrame,
    knobs: list[str], target: float, slos: tuple[float | None, float | None] = (None, None),
    plotlyjs: PlotlyJs = INLINE,
) -> None:  # fmt: skip
    """``out/capacity.html``; ``slos`` are the TTFT and TPOT objectives (ms); self-contained
    unless ``plotlyjs`` says otherwise."""
    sections = [
        Section(
            "Capacity",
            "Highest passing rate scale per configuration, its rate, the replicas the trace's "
            "own rate needs with the traffic split evenly and, with --replicas-search, found "
            "by simulating the cluster behind the router, and the binding limit at and just "
            "above it. The legend under the table names each column as capacity.csv does.",
            capacity_table_html(capacity, knobs),
        ),
    ]
    if len(probes):
        sections += _probe_sections(_curves(capacity, probes, knobs), target, slos)
    header = f"<h1>{html.escape(title)}</h1><div class='sub'>{html.escape(subtitle)}</div>"
    write_page(out / "capacity.html", title, header, sections, plotlyjs)
