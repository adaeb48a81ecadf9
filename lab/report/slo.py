"""Goodput: the requests that meet the TTFT and TPOT SLOs, separately and together.

A request meets an SLO when its latency is at or under the target; a request
with a single output token has no TPOT and meets the TPOT SLO. Rejected
requests meet neither. Goodput is the rate of requests that meet both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.report.plotting import log_axis
from lab.report.stages import completed_requests
from schema.frames import numeric

MAX_SCATTER_POINTS = 2000


@dataclass(frozen=True, slots=True)
class SloResult:
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    num_requests: int
    meets_ttft: float
    """Fraction of all requests (rejected included) that meet the TTFT SLO."""
    meets_tpot: float
    meets_both: float
    goodput_rps: float | None


def _meets(values: np.ndarray, slo: float | None, missing_meets: bool) -> np.ndarray:
    if slo is None:
        return np.ones(values.size, dtype=bool)
    return np.where(np.isfinite(values), values <= slo, missing_meets)


def slo_result(
    requests: pd.DataFrame, slo_ttft_ms: float | None, slo_tpot_ms: float | None, duration_s: float
) -> SloResult:
    done = completed_requests(requests)
    ttft_ok = _meets(numeric(done, "ttft_ms"), slo_ttft_ms, missing_meets=False)
    tpot_ok = _meets(numeric(done, "tpot_ms"), slo_tpot_ms, missing_meets=True)
    n = len(requests)
    both = int((ttft_ok & tpot_ok).sum())
    goodput = (
        both / duration_s if duration_s and np.isfinite(duration_s) and duration_s > 0 else None
    )
    return SloResult(
        slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms,
        num_requests=n,
        meets_ttft=float(ttft_ok.sum()) / n if n else 0.0,
        meets_tpot=float(tpot_ok.sum()) / n if n else 0.0,
        meets_both=both / n if n else 0.0,
        goodput_rps=goodput,
    )


def slo_figure(requests: pd.DataFrame, result: SloResult) -> go.Figure:
    """Left: fraction of requests meeting each SLO. Right: TTFT vs TPOT, SLOs as lines."""
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.35, 0.65],
        subplot_titles=[
            "share of all requests meeting the SLO",
            "TTFT vs TPOT per completed request",
        ],
        horizontal_spacing=0.1,
    )
    labels = ["TTFT SLO", "TPOT SLO", "both (goodput)"]
    values = [result.meets_ttft, result.meets_tpot, result.meets_both]
    fig.add_trace(
        go.Bar(
            x=labels,
            y=[100 * v for v in values],
            text=[f"{100 * v:.1f}%" for v in values],
            textposition="outside",
            marker_color=["#1f77b4", "#ff7f0e", "#2ca02c"],
            showlegend=False,
            hovertemplate="%{x}: %{y:.1f}%<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.update_yaxes(range=[0, 115], title_text="% of requests", row=1, col=1)
    done = completed_requests(requests)
    ttft, tpot = numeric(done, "ttft_ms"), numeric(done, "tpot_ms")
    ok = np.isfinite(ttft) & np.isfinite(tpot)
    idx = np.flatnonzero(ok)
    if idx.size > MAX_SCATTER_POINTS:
        idx = np.random.default_rng(0).choice(idx, MAX_SCATTER_POINTS, replace=False)
    meets = _meets(ttft[idx], result.slo_ttft_ms, False) & _meets(
        tpot[idx], result.slo_tpot_ms, True
    )
    for flag, name, color in ((True, "meets both", "#2ca02c"), (False, "misses", "#d62728")):
        sel = idx[meets == flag]
        fig.add_trace(
            go.Scattergl(
                x=ttft[sel],
                y=tpot[sel],
                mode="markers",
                name=name,
                marker={"color": color, "size": 4, "opacity": 0.6},
                hovertemplate="TTFT %{x:.1f} ms<br>TPOT %{y:.2f} ms<extra></extra>",
            ),
            row=1,
            col=2,
        )
    if result.slo_ttft_ms is not None:
        fig.add_vline(x=result.slo_ttft_ms, line={"dash": "dash", "color": "#555"}, row=1, col=2)
    if result.slo_tpot_ms is not None:
        fig.add_hline(y=result.slo_tpot_ms, line={"dash": "dash", "color": "#555"}, row=1, col=2)
    slo_line = [] if result.slo_ttft_ms is None else [result.slo_ttft_ms]
    fig.update_xaxes(title_text="TTFT (ms)", **log_axis(ttft[idx], slo_line), row=1, col=2)
    fig.update_yaxes(title_text="TPOT (ms)", row=1, col=2)
    fig.update_layout(
        height=380,
        legend={"orientation": "h", "x": 0.62, "y": -0.2},
        margin={"t": 40, "b": 60, "l": 60, "r": 30},
    )
    return fig
