"""``capacity.html``: each configuration's capacity, replicas and the limit at the edge."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from lab.report.page import Section, figure_div, page_html
from lab.report.sweep_page import describe_knobs, rows_table


def _attainment_figure(
    capacity: pd.DataFrame, probes: pd.DataFrame, knobs: list[str], target: float
) -> go.Figure:
    fig = go.Figure()
    names = dict(zip(capacity["config_id"], describe_knobs(capacity, knobs), strict=True))
    for config_id, part in probes.groupby("config_id", sort=True):
        part = part.sort_values("rate_scale")
        fig.add_trace(
            go.Scatter(
                x=part["rate_scale"], y=part["slo_attainment"], mode="lines+markers",
                name=names[config_id], text=part["binding_limit"],
                hovertemplate="rate scale %{x:.3g}: attainment %{y:.3f}<br>binding limit "
                "%{text}<extra></extra>",
            )
        )  # fmt: skip
    fig.add_hline(y=target, line={"color": "#d62728", "dash": "dash"})
    fig.update_xaxes(type="log", title_text="rate scale (x the trace's arrival rate)")
    fig.update_yaxes(title_text="SLO attainment", range=[0, 1.03])
    fig.update_layout(height=460, margin={"t": 30, "b": 50, "l": 70, "r": 30})
    return fig


def write_capacity_page(
    out: Path, title: str, subtitle: str, capacity: pd.DataFrame, probes: pd.DataFrame,
    knobs: list[str], target: float,
) -> None:  # fmt: skip
    """``out/capacity.html``."""
    simulated = [c for c in ("replicas_simulated", "replicas_simulated_rate_scale",
                             "attainment_at_replicas", "attainment_one_fewer",
                             "replicas_simulated_note") if c in capacity]  # fmt: skip
    shown = ["config_id", *knobs, "max_rate_scale", "max_request_rate", "replicas",
             *simulated,
             "attainment_at_max", "binding_limit_at_max", "first_failing_scale",
             "binding_limit_above", "ttft_stage_above", "engine_busy_above",
             "ttft_ms_p90_at_max", "tpot_ms_p90_at_max", "probes",
             "error"]  # fmt: skip
    sections = [
        Section(
            "Capacity",
            "Highest passing rate scale per configuration, its rate, the replicas the trace's "
            "own rate needs with the traffic split evenly (ceil(1 / scale), "
            "replicas) and, with --replicas-search, found by simulating the "
            "cluster behind the router (replicas_simulated: the fewest that meet the SLOs "
            "at that rate scale; one fewer does not), and the binding limit at and just "
            "above it.",
            rows_table(capacity, shown),
        ),
        Section(
            "Probes",
            f"SLO attainment of every probe; dashed: the target {target:g}.",
            figure_div(_attainment_figure(capacity, probes, knobs, target)) if len(probes) else "",
        ),
    ]
    header = f"<h1>{html.escape(title)}</h1><div class='sub'>{html.escape(subtitle)}</div>"
    (out / "capacity.html").write_text(page_html(title, header, sections), encoding="utf-8")
