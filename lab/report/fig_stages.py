"""Where each request's time goes: stacked per-stage bars and each stage's mean share."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from lab.report.stages import STAGES, completed_requests, stage_column
from schema.frames import numeric

MAX_BARS = 2000
"""More completed requests than this are grouped, in arrival order, into this many bars."""


def stage_share_figure(shares: dict[str, float], ttft_shares: dict[str, float]) -> go.Figure:
    """Two 100%-style horizontal bars: each stage's share of mean E2E and of mean TTFT."""
    fig = go.Figure()
    rows = ["TTFT", "E2E"]
    for stage in STAGES:
        values = [ttft_shares.get(stage.name, 0.0), shares.get(stage.name, 0.0)]
        fig.add_trace(
            go.Bar(
                y=rows,
                x=[100 * v for v in values],
                name=stage.label,
                orientation="h",
                marker_color=stage.color,
                text=[f"{100 * v:.0f}%" if v >= 0.04 else "" for v in values],
                textposition="inside",
                insidetextanchor="middle",
                hovertemplate=f"{stage.label}: %{{x:.1f}}% of mean %{{y}}<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=230,
        xaxis_title="% of the mean latency",
        legend={"orientation": "h", "y": 1.25, "x": 0, "traceorder": "normal"},
        margin={"t": 50, "b": 45, "l": 60, "r": 30},
    )
    return fig


def _group_starts(n: int, max_bars: int) -> np.ndarray:
    """First index of each of at most ``max_bars`` consecutive, near-equal groups of ``n``."""
    return np.unique(np.linspace(0, n, min(n, max_bars) + 1)[:-1].astype(np.int64))


def stage_breakdown_figure(requests: pd.DataFrame, max_bars: int = MAX_BARS) -> go.Figure:
    """Stacked bars of per-stage time per request, in arrival order.

    With more than ``max_bars`` requests each bar is the mean over a group of
    consecutive requests, so the figure's size does not grow with the trace.
    """
    done = completed_requests(requests)
    order = np.argsort(numeric(done, "arrival"), kind="stable")
    done = done.iloc[order]
    n = len(done)
    fig = go.Figure()
    if n == 0:
        fig.add_annotation(text="no completed requests", showarrow=False, x=0.5, y=0.5)
        return fig
    starts = _group_starts(n, max_bars)
    sizes = np.diff(np.append(starts, n))
    arrival = numeric(done, "arrival")
    first_arrival = arrival[starts]
    grouped = n > max_bars
    if grouped:
        hover_who = [
            f"requests {s + 1}-{s + k}, arrived {arrival[s]:.1f}-{arrival[s + k - 1]:.1f} s"
            for s, k in zip(starts, sizes, strict=True)
        ]
    else:
        rids = done["rid"].astype(str).to_numpy() if "rid" in done.columns else starts.astype(str)
        hover_who = [
            f"{rid}, arrived {a:.2f} s" for rid, a in zip(rids, first_arrival, strict=True)
        ]
    for i, stage in enumerate(STAGES):
        values = np.nan_to_num(stage_column(done, stage))
        means = np.add.reduceat(values, starts) / sizes
        who = "<br>%{customdata}" if i == 0 else ""
        fig.add_trace(
            go.Bar(
                x=starts + 1,
                y=means,
                name=stage.label,
                marker={"color": stage.color, "line": {"width": 0}},
                customdata=hover_who if i == 0 else None,
                hovertemplate=f"{stage.label}: %{{y:.1f}} ms{who}<extra></extra>",
            )
        )
    ttft_only = [stage.in_ttft for stage in STAGES]
    fig.update_layout(
        updatemenus=[
            {
                "type": "buttons",
                "direction": "right",
                "x": 0,
                "y": -0.2,
                "xanchor": "left",
                "yanchor": "top",
                "showactive": True,
                "buttons": [
                    {"label": "all stages", "method": "restyle", "args": ["visible", True]},
                    {
                        "label": "stages up to the first token",
                        "method": "restyle",
                        "args": ["visible", ttft_only],
                    },
                ],
            }
        ]
    )
    what = f"mean of ~{n / len(starts):.0f} requests per bar" if grouped else "one bar per request"
    fig.update_layout(
        barmode="stack",
        bargap=0,
        hovermode="x unified",
        height=440,
        xaxis_title=f"request number, in arrival order ({what})",
        yaxis_title="time (ms)",
        legend={"orientation": "h", "y": 1.12, "x": 0, "traceorder": "normal"},
        margin={"t": 50, "b": 80, "l": 60, "r": 30},
    )
    return fig
