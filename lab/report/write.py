"""``write_report``: the replay's bottleneck report as one self-contained HTML file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab.report.fig_latency import latency_cdf_figure
from lab.report.fig_stages import stage_breakdown_figure, stage_share_figure
from lab.report.fig_timeline import timeline_figure
from lab.report.header import header_html
from lab.report.page import Section, figure_div, trace_path, write_page
from lab.report.plotlyjs import INLINE, PlotlyJs
from lab.report.replicas import busiest, cluster_replicas, one_replica, replicas_table
from lab.report.slo import slo_figure, slo_result
from lab.report.tables import config_tables, evidence_table
from lab.report.verdict import bottleneck_verdict
from schema.frames import as_float, get_path
from schema.jsonsafe import json_safe
from schema.samples import Samples

REPORT_NAME = "report.html"


def write_report(
    out_dir: Path,
    summary: dict[str, Any],
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    queues: pd.DataFrame,
    itl: np.ndarray | Samples | None = None,
    plotlyjs: PlotlyJs = INLINE,
) -> dict[str, Any]:
    """Writes ``out_dir/report.html`` and returns the bottleneck verdict as a JSON-friendly
    dict. By default the page is self-contained (plotly.js inlined, works offline);
    ``plotlyjs`` picks a shared ``plotly.min.js`` or the CDN instead (``lab.report.plotlyjs``).

    The verdict is ``bottleneck_verdict(...)`` plus ``slo``: the fractions of
    requests meeting each SLO of ``summary.goodput``. For a cluster (``summary.replicas``
    holds several), the timelines and the verdict read the busiest replica's steps and
    queues (``lab.report.replicas``), and a table compares the replicas.
    """
    replicas = cluster_replicas(summary)
    shown = busiest(replicas) if replicas else 0
    steps, queues = one_replica(steps, shown), one_replica(queues, shown)
    verdict = bottleneck_verdict(summary, requests, steps, queues)
    duration = as_float(verdict["evidence"].get("duration_s")) or float("nan")
    slo = slo_result(
        requests,
        as_float(get_path(summary, "goodput", "slo_ttft_ms")),
        as_float(get_path(summary, "goodput", "slo_tpot_ms")),
        duration,
    )
    max_running = as_float(get_path(summary, "config", "max_running"))
    has_slo = slo.slo_ttft_ms is not None or slo.slo_tpot_ms is not None
    sections = [
        Section(
            "Where the time goes",
            "Top: each stage's mean time as a share of mean TTFT and of mean E2E. Bottom: the "
            "stages of each request stacked, in arrival order.",
            figure_div(stage_share_figure(verdict["stage_shares"], verdict["ttft_stage_shares"]))
            + figure_div(stage_breakdown_figure(requests)),
        ),
        Section(
            "Latency distributions",
            "Cumulative distribution of each latency over completed requests (ITL over all "
            "inter-token gaps); dotted lines mark P50, P90 and P99.",
            figure_div(latency_cdf_figure(requests, itl)),
        ),
        Section(
            "Goodput and SLOs",
            "Requests meeting the TTFT and TPOT targets, separately and together (rejected "
            "requests count as misses)."
            if has_slo
            else "No SLO targets in summary.goodput.",
            figure_div(slo_figure(requests, slo)) if has_slo else "",
        ),
        Section(
            "Timelines",
            "The run over time, binned (max or mean per bin as labelled). Zoom one row and "
            "the others follow."
            + (f" Steps and queues of replica {shown}, the busiest." if replicas else ""),
            figure_div(timeline_figure(requests, steps, queues, max_running)),
        ),
        Section(
            "Bottleneck evidence",
            "The figures the verdict reads; the first rule that holds, top to bottom, "
            "names the binding limit (admission limits compete on their share of steps).",
            evidence_table(verdict),
        ),
        Section("Run configuration", "As given in summary.json.", config_tables(summary)),
    ]
    if replicas:
        note = (
            f"{len(replicas)} replicas behind one router: the requests placed on each, its "
            "throughput, TTFT, prefix-cache hit rate and busy share (its step time over the "
            f"run's duration). The verdict and the timelines read replica {shown}'s steps."
        )
        sections.insert(0, Section("Replicas", note, replicas_table(summary, shown)))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    title = f"sim report: {Path(trace_path(summary)).name}"
    header = header_html(summary, requests, verdict, slo)
    write_page(out_dir / REPORT_NAME, title, header, sections, plotlyjs)
    verdict["slo"] = json_safe(
        {
            "slo_ttft_ms": slo.slo_ttft_ms,
            "slo_tpot_ms": slo.slo_tpot_ms,
            "meets_ttft": slo.meets_ttft,
            "meets_tpot": slo.meets_tpot,
            "meets_both": slo.meets_both,
            "goodput_rps": slo.goodput_rps,
        }
    )
    return verdict
