"""``capacity.html``: each configuration's capacity, replicas and the limit at the edge, and
its probes: the requests that miss an SLO and the P99 tails against the rate scale."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from lab.report.page import Section, figure_div, page_html
from lab.report.sweep_page import describe_knobs, rows_table

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
    fig.update_xaxes(type="log", title_text="rate scale (x the trace's arrival rate)")
    fig.update_yaxes(type="log", title_text=f"requests missing an SLO (floor {MISS_FLOOR:g})")
    fig.update_layout(height=420, margin={"t": 30, "b": 50, "l": 80, "r": 30})
    return fig


def _tail_figure(
    curves: list[tuple[str, pd.DataFrame]], column: str, slo: float | None, label: str
) -> go.Figure:
    """``column`` (a P99 latency) against the rate scale, with the SLO as a dashed line."""
    fig = go.Figure()
    for name, part in curves:
        if column in part:
            fig.add_trace(
                go.Scatter(x=part["rate_scale"], y=part[column], mode="lines+markers", name=name)
            )
    if slo is not None:
        fig.add_hline(y=slo, line={"color": "#d62728", "dash": "dash"})
    fig.update_xaxes(type="log", title_text="rate scale (x the trace's arrival rate)")
    fig.update_yaxes(type="log", title_text=label)
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


def write_capacity_page(
    out: Path, title: str, subtitle: str, capacity: pd.DataFrame, probes: pd.DataFrame,
    knobs: list[str], target: float, slos: tuple[float | None, float | None] = (None, None),
) -> None:  # fmt: skip
    """``out/capacity.html``; ``slos`` are the TTFT and TPOT objectives (ms)."""
    simulated = [c for c in ("replicas_simulated", "replicas_simulated_rate_scale",
                             "attainment_at_replicas", "attainment_one_fewer",
                             "replicas_simulated_note") if c in capacity]  # fmt: skip
    shown = ["config_id", *knobs, "max_rate_scale", "max_request_rate", "replicas_even_split",
             *simulated,
             "attainment_at_max", "binding_limit_at_max", "first_failing_scale",
             "crossing_scale", "binding_limit_above", "ttft_stage_above", "engine_busy_above",
             "ttft_ms_p90_at_max", "tpot_ms_p90_at_max", "probes",
             "error"]  # fmt: skip
    sections = [
        Section(
            "Capacity",
            "Highest passing rate scale per configuration, its rate, the replicas the trace's "
            "own rate needs with the traffic split evenly (ceil(1 / scale), "
            "replicas_even_split) and, with --replicas-search, found by simulating the "
            "cluster behind the router (replicas_simulated: the fewest that meet the SLOs "
            "at that rate scale; one fewer does not), and the binding limit at and just "
            "above it.",
            f"<div style='overflow-x: auto'>{rows_table(capacity, shown)}</div>",
        ),
    ]
    if len(probes):
        sections += _probe_sections(_curves(capacity, probes, knobs), target, slos)
    header = f"<h1>{html.escape(title)}</h1><div class='sub'>{html.escape(subtitle)}</div>"
    (out / "capacity.html").write_text(page_html(title, header, sections), encoding="utf-8")
