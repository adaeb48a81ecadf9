"""Latency CDFs (TTFT, TPOT, ITL, E2E) with P50/P90/P99 marked."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.report.binning import MAX_POINTS
from lab.report.plotting import annotate_no_data
from lab.report.plotting import log_axis as log_axis_ticks
from lab.report.stages import completed_requests
from schema.frames import numeric
from schema.samples import Samples, WeightedSamples
from schema.spill import SpilledSamples

PERCENTILES = (50, 90, 99)
PERCENTILE_COLORS = {50: "#2ca02c", 90: "#ff7f0e", 99: "#d62728"}
LOG_AXIS_RATIO = 50.0
"""Use a log x axis when P99 / P1 exceeds this (heavy tails)."""
TAIL_RANGE = 1.5
"""A linear x axis ends at this multiple of P99 when the maximum lies further out."""


def as_samples(values: np.ndarray | Samples | None) -> WeightedSamples:
    """Plain values (each once), weighted samples as they are (read into memory from disk),
    or no samples for None."""
    if values is None:
        return WeightedSamples.of([])
    if isinstance(values, WeightedSamples):
        return values
    if isinstance(values, SpilledSamples):
        return values.load()
    return WeightedSamples.of(np.asarray(values, dtype=float))


def latency_series(
    requests: pd.DataFrame, itl_s: np.ndarray | Samples | None
) -> dict[str, WeightedSamples]:
    """Finite latencies in ms by metric name; ITL comes from the pooled inter-token gaps."""
    done = completed_requests(requests)
    series = {
        "TTFT": WeightedSamples.of(numeric(done, "ttft_ms")),
        "TPOT": WeightedSamples.of(numeric(done, "tpot_ms")),
        "ITL": as_samples(itl_s).scaled(1e3),
        "E2E": WeightedSamples.of(numeric(done, "e2e_ms")),
    }
    return {name: s.finite() for name, s in series.items()}


def latency_cdf_figure(requests: pd.DataFrame, itl_s: np.ndarray | Samples | None) -> go.Figure:
    series = latency_series(requests, itl_s)
    names = list(series)
    titles = [f"<b>{n}</b> (ms)" for n in names]
    shapes: list[dict[str, object]] = []  # percentile lines (one layout update, not one each)
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=[f"{n} (ms)" for n in names],
        horizontal_spacing=0.08,
        vertical_spacing=0.16,
    )
    for i, name in enumerate(names):
        row, col = i // 2 + 1, i % 2 + 1
        finite = series[name]
        if not finite.size:
            annotate_no_data(fig, row, col)
            continue
        x, y = finite.cdf_points(MAX_POINTS)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                line={"color": "#1f77b4", "width": 2},
                name=name,
                showlegend=False,
                hovertemplate=f"{name} %{{x:.1f}} ms<br>CDF %{{y:.3f}}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        qs = finite.percentile(PERCENTILES)
        subplot = fig.get_subplot(row, col)
        xref = subplot.xaxis.plotly_name.replace("axis", "")
        yref = subplot.yaxis.plotly_name.replace("axis", "") + " domain"
        shapes += [
            {"type": "line", "xref": xref, "yref": yref, "x0": float(q), "x1": float(q),
             "y0": 0, "y1": 1, "line": {"color": PERCENTILE_COLORS[p], "dash": "dot", "width": 1}}
            for p, q in zip(PERCENTILES, qs, strict=True)
        ]  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=qs,
                y=[p / 100 for p in PERCENTILES],
                mode="markers",
                marker={"color": [PERCENTILE_COLORS[p] for p in PERCENTILES], "size": 9},
                text=[f"P{p} {q:,.1f} ms" for p, q in zip(PERCENTILES, qs, strict=True)],
                showlegend=False,
                hoverinfo="text",
            ),
            row=row,
            col=col,
        )
        titles[i] = f"<b>{name}</b> (ms): " + " · ".join(
            f"<span style='color:{PERCENTILE_COLORS[p]}'>P{p} {q:,.1f}</span>"
            for p, q in zip(PERCENTILES, qs, strict=True)
        )
        lo, hi = float(finite.percentile([1])[0]), float(qs[-1])
        log_axis = lo > 0 and hi / lo > LOG_AXIS_RATIO
        axis = log_axis_ticks(x) if log_axis else {"type": "linear"}
        fig.update_xaxes(**axis, row=row, col=col)
        top = float(finite.values.max())
        if not log_axis and top > TAIL_RANGE * hi > 0:
            left = min(0.0, float(finite.values.min()))
            fig.update_xaxes(range=[left, TAIL_RANGE * hi], row=row, col=col)
            titles[i] += f" · max {top:,.1f} (zoom out)"
        fig.update_yaxes(range=[0, 1.04], title_text="fraction", row=row, col=col)
    for annotation, title in zip(fig.layout.annotations, titles, strict=False):
        annotation.text = title
    fig.update_layout(shapes=shapes, height=660, margin={"t": 60, "b": 40, "l": 60, "r": 30})
    return fig
