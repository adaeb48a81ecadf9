"""``sweep.html``: the Pareto fronts of a sweep and the effect of each knob (self-contained)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.report.page import Section, figure_div, write_page
from lab.report.plotlyjs import INLINE, PlotlyJs

MIN_EFFECT_BAND = 0.10
"""A knob-effect panel's y axis spans at least this share of the mean either side."""
MAX_TABLE_ROWS = 200
"""Configurations listed in the page's table (best goodput first); the CSV has them all."""
LABELS = {
    "output_throughput": "output tok/s",
    "goodput": "goodput (req/s)",
    "ttft_ms_p90": "P90 TTFT (ms)",
    "tpot_ms_p90": "P90 TPOT (ms)",
}


def describe_knobs(table: pd.DataFrame, knobs: list[str]) -> list[str]:
    """Per configuration: ``knob=value, ...`` of the swept knobs."""
    return [
        ", ".join(f"{k}={row[k]}" for k in knobs) or f"config {row['config_id']}"
        for _, row in table.iterrows()
    ]


def _pareto_figure(table: pd.DataFrame, knobs: list[str]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1)
    ok = table[table["status"] == "ok"]
    text = describe_knobs(ok, knobs)
    for col, (flag, latency) in enumerate(
        (("pareto_ttft", "ttft_ms_p90"), ("pareto_tpot", "tpot_ms_p90")), start=1
    ):
        fig.add_trace(
            go.Scatter(
                x=ok[latency], y=ok["output_throughput"], mode="markers", text=text,
                marker={"color": "#bbb", "size": 8}, name="configuration", showlegend=col == 1,
                hovertemplate="%{text}<br>%{x:.1f} ms, %{y:,.0f} tok/s<extra></extra>",
            ),
            row=1, col=col,
        )  # fmt: skip
        front = ok[ok[flag].astype(bool)].sort_values(latency)
        fig.add_trace(
            go.Scatter(
                x=front[latency], y=front["output_throughput"], mode="lines+markers",
                text=describe_knobs(front, knobs), name="Pareto front", showlegend=col == 1,
                marker={"color": "#d62728", "size": 10}, line={"color": "#d62728"},
                hovertemplate="%{text}<br>%{x:.1f} ms, %{y:,.0f} tok/s<extra></extra>",
            ),
            row=1, col=col,
        )  # fmt: skip
        fig.update_xaxes(title_text=LABELS[latency], row=1, col=col)
        fig.update_yaxes(title_text=LABELS["output_throughput"], row=1, col=col)
    fig.update_layout(height=460, margin={"t": 30, "b": 50, "l": 70, "r": 30})
    return fig


def effect_range(values: np.ndarray) -> tuple[list[float] | None, float]:
    """A knob-effect panel's y range and the spread of its values ((max - min) / |mean|).

    The range spans at least ``MIN_EFFECT_BAND`` of the mean either side, so that a change
    of 0.01 % draws flat and one of 50 % fills the panel; it starts at zero rather than
    dip below it for values that are not negative. ``None`` when nothing is finite."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return None, float("nan")
    lo, hi, mean = float(finite.min()), float(finite.max()), float(finite.mean())
    spread = (hi - lo) / abs(mean) if mean else float("nan")
    half = max(0.6 * (hi - lo), MIN_EFFECT_BAND * abs(mean), 1e-9)
    center = (hi + lo) / 2
    bottom = center - half
    if lo >= 0 > bottom:
        bottom = 0.0
    return [bottom, max(center + half, bottom + 2 * half)], spread


def _spread_text(spread: float) -> str:
    if not np.isfinite(spread):
        return "spread n/a"
    pct = 100 * spread
    return f"spread {pct:,.0f} %" if pct >= 10 else f"spread {pct:.2g} %"


def _effects_figure(effects: pd.DataFrame) -> go.Figure:
    knobs = list(dict.fromkeys(effects["knob"]))
    metrics = list(LABELS)
    panels = {
        (k, m): effect_range(effects.loc[effects["knob"] == k, m].to_numpy(dtype=float))
        for k in knobs
        for m in metrics
    }
    fig = make_subplots(
        rows=len(knobs), cols=len(metrics), vertical_spacing=min(0.12, 0.6 / len(knobs)),
        horizontal_spacing=0.07,
        subplot_titles=[f"{LABELS[m]} ({_spread_text(panels[k, m][1])})"
                        for k in knobs for m in metrics],
    )  # fmt: skip
    for r, knob in enumerate(knobs, start=1):
        part = effects[effects["knob"] == knob]
        for c, metric in enumerate(metrics, start=1):
            y = part[metric].to_numpy(dtype=float)
            change = 100 * (y / y[0] - 1) if y.size and y[0] else np.full(y.size, np.nan)
            fig.add_trace(
                go.Scatter(
                    x=part["value"], y=y, customdata=change, mode="lines+markers",
                    showlegend=False, line={"color": "#1f77b4"},
                    hovertemplate=f"{knob}=%{{x}}<br>median {LABELS[metric]} %{{y:,.1f}}<br>"
                    f"%{{customdata:+.2f}} % vs {knob}={part['value'].iloc[0]}<extra></extra>",
                ),
                row=r, col=c,
            )  # fmt: skip
            fig.update_xaxes(type="category", title_text=knob, row=r, col=c)
            fig.update_yaxes(range=panels[knob, metric][0], row=r, col=c)
    fig.update_layout(height=260 * len(knobs) + 60, margin={"t": 40, "b": 40, "l": 60, "r": 30})
    return fig


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if np.isnan(value):
            return ""
        return f"{value:.3g}" if 0 < abs(value) < 1 else f"{value:,.2f}"
    return html.escape("" if value is None else str(value))


def rows_table(
    table: pd.DataFrame, columns: list[str], headers: dict[str, str] | None = None
) -> str:
    """An HTML table of ``columns`` in a box that scrolls sideways when the table is wider
    than the page; ``headers`` gives short headers (the column's name shows on hover).
    Rows flagged ``picked`` (if present) are highlighted."""
    named = headers or {}
    head = "".join(
        f"<th title='{html.escape(c)}'>{html.escape(named.get(c, c))}</th>" for c in columns
    )
    body = "".join(
        f"<tr{' class=picked' if row.get('picked') else ''}>"
        + "".join(f"<td>{_cell(row[c])}</td>" for c in columns)
        + "</tr>"
        for _, row in table.iterrows()
    )
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"


def write_sweep_page(
    out: Path, title: str, subtitle: str, table: pd.DataFrame, effects: pd.DataFrame,
    knobs: list[str], plotlyjs: PlotlyJs = INLINE,
) -> None:  # fmt: skip
    """``out/sweep.html`` (self-contained unless ``plotlyjs`` says otherwise)."""
    ok = table[table["status"] == "ok"]
    best = ok.sort_values("goodput", ascending=False).head(MAX_TABLE_ROWS)
    best = best.assign(picked=best["pareto_ttft"] | best["pareto_tpot"])
    shown = ["config_id", *knobs, "goodput", "slo_attainment", "output_throughput",
             "request_throughput", "ttft_ms_p90", "tpot_ms_p90", "binding_limit"]  # fmt: skip
    failed = table[table["status"] != "ok"]
    sections = [
        Section(
            "Pareto fronts",
            "Output throughput against P90 TTFT (left) and P90 TPOT (right); red: the "
            "configurations that no other beats on both.",
            figure_div(_pareto_figure(table, knobs)),
        ),
        Section(
            "Knob effects",
            "For each swept knob (a row), the median of each metric over the configurations "
            f"with each value. Each y axis spans at least ±{100 * MIN_EFFECT_BAND:.0f} % of "
            "its mean, so a slope shows a change in proportion; the title gives the spread "
            "(max - min over the mean), the hover the change against the first value.",
            figure_div(_effects_figure(effects)) if len(effects) else "<p>No knob is swept.</p>",
        ),
        Section(
            "Configurations",
            f"Best goodput first (at most {MAX_TABLE_ROWS}; highlighted: on a Pareto front).",
            rows_table(best, shown),
        ),
        Section(
            "Failed configurations",
            f"{len(failed)} configuration(s) failed; the others ran.",
            rows_table(failed, ["config_id", *knobs, "error"]) if len(failed) else "",
        ),
    ]
    header = f"<h1>{html.escape(title)}</h1><div class='sub'>{html.escape(subtitle)}</div>"
    write_page(out / "sweep.html", title, header, sections, plotlyjs)
