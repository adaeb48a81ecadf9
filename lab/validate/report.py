"""``report.html`` of ``sim validate``: the real runs and the simulation overlaid.

Sections: the comparison table (real, sim, relative error, real-vs-real
noise), where the error comes from (``lab.validate.attribution``), the
latency CDFs of every run on shared axes, and timelines on one time axis
(TTFT of each request by arrival, batch size per step, requests running).
The page loads plotly.js as ``--plotlyjs`` says (``lab/report/plotlyjs.py``).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.report.binning import MAX_POINTS, TimeBins, bin_max, bin_mean
from lab.report.fig_latency import latency_series
from lab.report.page import Section, figure_div, page_html
from lab.report.plotlyjs import INLINE, PlotlyJs
from lab.validate.attribution_report import attribution_section
from lab.validate.compare import LATENCIES, STATS, THROUGHPUTS, lookup
from lab.validate.regime import describe
from schema.frames import numeric
from schema.run import RunResult

REPORT_NAME = "report.html"
SIM_COLOR = "#ff7f0e"
REAL_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf")


def _runs(real: list[RunResult], sim: RunResult) -> list[tuple[str, str, RunResult]]:
    named = [(f"real {i + 1}", REAL_COLORS[i % len(REAL_COLORS)], r) for i, r in enumerate(real)]
    return [*named, ("sim", SIM_COLOR, sim)]


def cdf_figure(runs: list[tuple[str, str, RunResult]]) -> go.Figure:
    names = ("TTFT", "TPOT", "ITL", "E2E")
    fig = make_subplots(rows=2, cols=2, subplot_titles=[f"<b>{n}</b> (ms)" for n in names])
    for label, color, run in runs:
        series = latency_series(run.requests, run.itl_s)
        for k, name in enumerate(names):
            x, y = series[name].cdf_points(MAX_POINTS)
            fig.add_trace(
                go.Scatter(x=x, y=y, name=label, legendgroup=label, showlegend=k == 0,
                           line={"color": color, "dash": "solid" if label == "sim" else "dot"}),
                row=k // 2 + 1, col=k % 2 + 1,
            )  # fmt: skip
    fig.update_yaxes(title_text="fraction", range=[0, 1])
    fig.update_layout(height=620, margin={"t": 40, "b": 30})
    return fig


def timeline_figure(runs: list[tuple[str, str, RunResult]]) -> go.Figure:
    titles = ("TTFT by arrival (ms, mean per bin)", "batch size per step (max per bin)",
              "requests running (max per bin)")  # fmt: skip
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, subplot_titles=titles)
    times = [numeric(r.requests, "arrival") for _, _, r in runs]
    times += [numeric(r.requests, "finished") for _, _, r in runs]
    bins = TimeBins.covering(times, max_points=400)
    x = bins.centers()
    for label, color, run in runs:
        req, steps = run.requests, run.steps
        step_t = numeric(steps, "time")
        rows = (
            bin_mean(bins, numeric(req, "arrival"), numeric(req, "ttft_ms")),
            bin_max(bins, step_t, numeric(steps, "batch_size")),
            bin_max(bins, step_t, numeric(steps, "num_running")),
        )
        for k, y in enumerate(rows):
            fig.add_trace(
                go.Scatter(x=x, y=y, name=label, legendgroup=label, showlegend=k == 0,
                           line={"color": color}, connectgaps=False),
                row=k + 1, col=1,
            )  # fmt: skip
    fig.update_xaxes(title_text="time (s)", row=3, col=1)
    fig.update_layout(height=760, margin={"t": 40, "b": 30})
    return fig


def comparison_table(comparison: dict[str, Any]) -> str:
    bound = comparison["targets"]["bound"]
    targeted = set(comparison["targets"]["keys"])

    def cell(v: float | None, pct: bool = False) -> str:
        if v is None:
            return "-"
        return f"{v:+.1%}" if pct else f"{v:,.2f}"

    head = "<tr><th>metric</th><th>real</th><th>sim</th><th>rel err</th><th>noise</th></tr>"
    rows = []
    for key in [f"{m}.{q}" for m in LATENCIES for q in STATS] + list(THROUGHPUTS):
        e = lookup(comparison, key)
        err = e["rel_err"]
        miss = key in targeted and (err is None or abs(err) > bound)
        style = " style='background:#ffe5e5'" if miss else ""
        noise = "-" if e["noise"] is None else f"{e['noise']:.1%}"
        rows.append(
            f"<tr{style}><td>{html.escape(key)}</td><td>{cell(e['real'])}</td>"
            f"<td>{cell(e['sim'])}</td><td>{cell(err, True)}</td><td>{noise}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def write_validation_report(
    out_dir: Path,
    comparison: dict[str, Any],
    real: list[RunResult],
    sim: RunResult,
    attribution: dict[str, Any],
    plotlyjs: PlotlyJs = INLINE,
) -> None:
    """``out_dir/report.html``: the real runs against the simulation (``plotlyjs``: how the
    page loads plotly.js)."""
    runs = _runs(real, sim)
    t = comparison["targets"]
    verdict = "met" if t["met"] else f"missed on {', '.join(t['missed'])}"
    regime = comparison.get("regime") or {}
    run = comparison.get("run", {})
    header = (
        f"<h1>Validation: {html.escape(Path(str(run.get('trace', {}).get('path', ''))).name)}</h1>"
        f"<div class='sub'>server {html.escape(str(run.get('url')))} · profile "
        f"{html.escape(str(run.get('profile')))} · {len(real)} real run(s)<br>"
        f"<code>{html.escape(str(run.get('command', '')))}</code></div>"
        f"<div class='verdict'>Targets (|rel err| ≤ {t['bound']:.0%} on "
        f"{html.escape(', '.join(t['keys']))}): <b>{html.escape(verdict)}</b>, in a "
        f"<b class='regime'>{html.escape(str(regime.get('real') or 'unknown'))}</b> run<br>"
        f"{html.escape(describe(regime)) if regime else ''}</div>"
    )
    sections = [
        Section(
            "Real against simulated",
            "rel err = (sim - real) / real with real the mean of the real runs; noise = the "
            "largest relative difference between two real runs. Red rows miss the target.",
            comparison_table(comparison),
        ),
        attribution_section(attribution),
        Section(
            "Latency distributions",
            "Cumulative distributions over completed requests; real runs dotted, the "
            "simulation solid.",
            figure_div(cdf_figure(runs)),
        ),
        Section(
            "Timelines",
            "The runs on one time axis (seconds from the first arrival). The real runs' steps "
            "are rebuilt from the server's token times.",
            figure_div(timeline_figure(runs)),
        ),
    ]
    path = Path(out_dir) / REPORT_NAME
    page = page_html(f"validation: {run.get('url')}", header, sections, plotlyjs.script(path))
    path.write_text(page, encoding="utf-8")
