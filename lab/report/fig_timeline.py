"""Timelines of a run on one shared time axis, binned to at most ``MAX_POINTS`` per trace.

Rows, top to bottom: arrivals, queue lengths per stage, running batch, tokens
per step (prefill vs decode), KV pages, prefix hit rate, output throughput,
and engine busy time with the reasons admission was blocked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.report.binning import (
    MAX_POINTS,
    TimeBins,
    bin_count,
    bin_max,
    bin_mean,
    bin_sum,
    last_value_at_edges,
    step_function_max,
    step_function_mean,
)
from lab.report.plotting import annotate_no_data
from lab.report.verdict import ADMISSION_LIMITS
from schema.frames import blocked_mask, numeric

MIN_STEPS_PER_BIN = 20
"""Fewer steps per bin make per-bin shares (blocked steps) too coarse to read."""
MIN_ARRIVALS_PER_BIN = 10
"""Arrival rates use coarser bins, so that a rate is not mostly 0 or 1 arrival."""
QUEUE_COLORS = {"tokenizer": "#9467bd", "scheduler": "#d62728", "detokenizer": "#2ca02c"}
BLOCKED_COLORS = {"kv_memory": "#8c564b", "running_cap": "#e377c2", "prefill_budget": "#ff7f0e"}
CAP_SHOWN_FRACTION = 0.25
"""Draw a limit (max_running, total KV pages) only once the data reaches this share of it."""


@dataclass(frozen=True, slots=True)
class Row:
    """One timeline. Traces named in ``secondary`` use a right-hand y axis titled ``y2_title``."""

    title: str
    y_title: str
    draw: Callable[[TimeBins], list[go.Scatter]]
    secondary: tuple[str, ...] = ()
    y2_title: str = ""
    y_range: tuple[float, float] | None = None


def _line(x: np.ndarray, y: np.ndarray, name: str, color: str, **kw: object) -> go.Scatter:
    return go.Scatter(x=x, y=y, name=name, mode="lines", line={"color": color, "width": 1.5, **kw})


def timeline_bins(requests: pd.DataFrame, steps: pd.DataFrame, queues: pd.DataFrame) -> TimeBins:
    """Bins over the whole run: at most ``MAX_POINTS``, about ``MIN_STEPS_PER_BIN`` steps each."""
    times = [numeric(requests, "arrival"), numeric(requests, "finished"), numeric(steps, "time")]
    times.append(numeric(queues, "time"))
    span = TimeBins.covering(times)
    count = int(np.clip(len(steps) // MIN_STEPS_PER_BIN, 20, MAX_POINTS))
    return TimeBins(span.start, span.end, count)


def timeline_figure(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    queues: pd.DataFrame,
    max_running: float | None,
) -> go.Figure:
    bins = timeline_bins(requests, steps, queues)
    x = bins.centers()
    t = numeric(steps, "time")

    def arrivals(b: TimeBins) -> list[go.Scatter]:
        times = numeric(requests, "arrival")
        count = int(np.clip(np.isfinite(times).sum() // MIN_ARRIVALS_PER_BIN, 10, b.count))
        coarse = TimeBins(b.start, b.end, count)
        rate = bin_count(coarse, times) / coarse.width
        return [_line(coarse.centers(), rate, "arrivals", "#1f77b4", shape="hvh")]

    def queue_lengths(b: TimeBins) -> list[go.Scatter]:
        out = []
        if {"time", "stage", "queue_len"} <= set(queues.columns):
            for stage, g in queues.groupby("stage", sort=True):
                qt, qv = numeric(g, "time"), numeric(g, "queue_len")
                color = QUEUE_COLORS.get(str(stage), "#7f7f7f")
                mean = step_function_mean(b, qt, qv)
                out.append(_line(x, mean, f"{stage} (mean)", color))
                peak = step_function_max(b, qt, qv)
                line = _line(x, peak, f"{stage} (max)", color, dash="dot", width=1)
                out.append(line.update(opacity=0.6))
        return out

    running_max = np.nanmax(numeric(steps, "num_running"), initial=0.0)

    def batch(b: TimeBins) -> list[go.Scatter]:
        out = [
            _line(x, bin_mean(b, t, numeric(steps, "batch_size")), "batch size (mean)", "#1f77b4"),
            _line(x, bin_max(b, t, numeric(steps, "num_running")), "running (max)", "#ff7f0e"),
            _line(x, bin_max(b, t, numeric(steps, "num_waiting")), "waiting (max)", "#d62728"),
        ]
        if max_running is not None and running_max >= CAP_SHOWN_FRACTION * max_running:
            cap = np.full(x.size, max_running)
            out.append(_line(x, cap, "max_running", "#555", dash="dash"))
        return out

    def tokens(b: TimeBins) -> list[go.Scatter]:
        return [
            _line(x, bin_mean(b, t, numeric(steps, "prefill_tokens")), "prefill tokens", "#ff7f0e"),
            _line(x, bin_mean(b, t, numeric(steps, "decode_requests")), "decode", "#1f77b4"),
        ]

    used = numeric(steps, "kv_pages_used")
    total = numeric(steps, "kv_pages_total")
    pages_total = float(np.nanmax(total)) if np.isfinite(total).any() else None

    def kv_pages(b: TimeBins) -> list[go.Scatter]:
        out = [
            _line(x, bin_max(b, t, used), "used (max)", "#8c564b"),
            _line(x, bin_mean(b, t, used), "used (mean)", "#c49c94"),
        ]
        if pages_total and np.nanmax(used, initial=0.0) >= CAP_SHOWN_FRACTION * pages_total:
            out.append(_line(x, bin_max(b, t, total), "total", "#555", dash="dash"))
        return out

    def hit_rate(b: TimeBins) -> list[go.Scatter]:
        cached = np.diff(last_value_at_edges(b, t, numeric(steps, "cached_tokens")))
        prompt = np.diff(last_value_at_edges(b, t, numeric(steps, "prompt_tokens")))
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.where(prompt > 0, 100 * cached / prompt, np.nan)
        return [_line(x, rate, "hit rate", "#17becf", shape="hv")]

    def throughput(b: TimeBins) -> list[go.Scatter]:
        first = bin_count(b, numeric(requests, "first_token"))
        decoded = bin_sum(b, t, numeric(steps, "decode_requests"))
        return [_line(x, (first + decoded) / b.width, "output tokens/s", "#2ca02c")]

    def busy_and_blocked(b: TimeBins) -> list[go.Scatter]:
        busy = bin_sum(b, t, numeric(steps, "duration_s", 0.0)) / b.width
        n = bin_count(b, t)
        out = [_line(x, 100 * np.clip(busy, 0, 1), "engine busy", "#000")]
        for reason in ADMISSION_LIMITS:
            hits = bin_count(b, t[blocked_mask(steps, reason)])
            with np.errstate(invalid="ignore", divide="ignore"):
                share = np.where(n > 0, 100 * hits / n, np.nan)
            area = _line(x, share, f"blocked: {reason}", BLOCKED_COLORS[reason], width=0.5)
            out.append(area.update(stackgroup="blocked"))
        return out

    kv_title = "KV cache pages used" + (f" (of {pages_total:,.0f})" if pages_total else "")
    cap_title = f" (max_running {max_running:,.0f})" if max_running is not None else ""
    rows = [
        Row("Arrivals: requests per second", "req/s", arrivals),
        Row(
            "Queue length per stage: time-weighted mean and max per bin", "requests", queue_lengths
        ),
        Row(
            f"Running batch: requests per step and running (left), waiting (right){cap_title}",
            "requests",
            batch,
            secondary=("waiting (max)",),
            y2_title="waiting",
        ),
        Row(
            "Per step (mean): prefill tokens (left) vs decode requests (right)",
            "prefill tokens",
            tokens,
            secondary=("decode",),
            y2_title="decode requests",
        ),
        Row(kv_title, "pages", kv_pages),
        Row(
            "Prefix cache hit rate: cached / prompt tokens per bin",
            "%",
            hit_rate,
            y_range=(0, 100),
        ),
        Row("Output throughput", "tokens/s", throughput),
        Row(
            "Engine busy time (line) and steps with admission blocked, by reason (stacked)",
            "%",
            busy_and_blocked,
            y_range=(0, 100),
        ),
    ]
    return _stack(rows, bins)


def _stack(rows: list[Row], bins: TimeBins) -> go.Figure:
    row_px = 200
    fig = make_subplots(
        rows=len(rows),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.035,
        subplot_titles=[r.title for r in rows],
        specs=[[{"secondary_y": bool(r.secondary)}] for r in rows],
    )
    for i, row in enumerate(rows, start=1):
        legend = "legend" if i == 1 else f"legend{i}"
        traces = row.draw(bins)
        for trace in traces:
            trace.update(legend=legend, connectgaps=False)
            secondary = trace.name in row.secondary
            fig.add_trace(trace, row=i, col=1, secondary_y=secondary if row.secondary else None)
        subplot = fig.get_subplot(i, 1)
        if not traces:
            annotate_no_data(fig, i, 1)
        y_axis: dict[str, object] = {"title_text": row.y_title, "rangemode": "tozero"}
        if row.y_range is not None:
            y_axis["range"] = list(row.y_range)
        if row.secondary:
            fig.update_yaxes(**y_axis, row=i, col=1, secondary_y=False)
            fig.update_yaxes(
                title_text=row.y2_title, rangemode="tozero", showgrid=False, tickmode="auto",
                nticks=5,
                row=i, col=1, secondary_y=True,
            )  # fmt: skip
        else:
            fig.update_yaxes(**y_axis, row=i, col=1)
        domain = subplot.yaxis.domain
        fig.layout[legend] = {"x": 1.05, "y": domain[1], "yanchor": "top", "font": {"size": 11}}
    fig.update_xaxes(title_text="time (s)", row=len(rows), col=1)
    fig.update_xaxes(showticklabels=True)
    fig.update_layout(
        height=row_px * len(rows) + 120,
        hovermode="x unified",
        showlegend=True,
        margin={"t": 40, "b": 50, "l": 70, "r": 190},
    )
    return fig
