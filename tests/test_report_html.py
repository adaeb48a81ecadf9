"""write_report: a self-contained page with every section, bounded in size for long runs."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from plotly.offline import get_plotlyjs
from test_report_synth import Run, Scenario, synthetic_run

from lab.report import bottleneck_verdict, write_report
from lab.report.binning import MAX_POINTS
from lab.report.fig_latency import latency_cdf_figure
from lab.report.fig_stages import MAX_BARS, stage_breakdown_figure
from lab.report.fig_timeline import timeline_figure

SECTIONS = (
    "Where the time goes",
    "Latency distributions",
    "Goodput and SLOs",
    "Timelines",
    "Bottleneck evidence",
    "Run configuration",
)


def _write(tmp_path: Path, run: Run, itl: np.ndarray | None = None) -> tuple[str, dict[str, Any]]:
    verdict = write_report(tmp_path, run.summary, run.requests, run.steps, run.queues, itl)
    return (tmp_path / "report.html").read_text(encoding="utf-8"), verdict


def test_report_is_self_contained_with_every_section(tmp_path: Path) -> None:
    run = synthetic_run(Scenario(busy=0.96, waiting_fraction=0.6, blocked={"kv_memory": 0.3}))
    page, verdict = _write(tmp_path, run, run.itl)
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.IGNORECASE)
    assert not re.search(r"<link[^>]*\bhref\s*=\s*['\"]?https?:", page, re.IGNORECASE)
    assert page.count(get_plotlyjs()[:500]) == 1
    for title in SECTIONS:
        assert f"<h2>{title}</h2>" in page
    assert page.count('class="plotly-graph-div"') == 5
    verdict_at = page.index(html.escape(verdict["text"]))
    assert verdict_at < page.index("plotly-graph-div")
    assert "KV memory" in page[:verdict_at]
    for shown in ("traces/synthetic.jsonl", "roofline", "H200 ceilings", "llama-3-8b"):
        assert html.escape(shown) in page
    expected = bottleneck_verdict(run.summary, run.requests, run.steps, run.queues)
    assert {k: v for k, v in verdict.items() if k != "slo"} == expected


def test_slo_fractions_count_each_target_and_rejected_requests(tmp_path: Path) -> None:
    run = synthetic_run(Scenario(rejected=40, scheduler_wait_ms=150.0))
    _, verdict = _write(tmp_path, run)
    done = run.requests[run.requests["status"] == "completed"]
    n = len(run.requests)
    slo = run.summary["goodput"]
    ttft_ok = done["ttft_ms"] <= slo["slo_ttft_ms"]
    tpot_ok = done["tpot_ms"] <= slo["slo_tpot_ms"]
    assert verdict["slo"]["meets_ttft"] == pytest.approx(ttft_ok.sum() / n)
    assert verdict["slo"]["meets_tpot"] == pytest.approx(tpot_ok.sum() / n)
    assert verdict["slo"]["meets_both"] == pytest.approx((ttft_ok & tpot_ok).sum() / n)
    both = verdict["slo"]["meets_both"]
    assert 0 < both < min(verdict["slo"]["meets_tpot"], verdict["slo"]["meets_ttft"])
    assert verdict["slo"]["goodput_rps"] == pytest.approx(
        (ttft_ok & tpot_ok).sum() / run.summary["duration_s"]
    )


def test_missing_optional_inputs_still_make_a_report(tmp_path: Path) -> None:
    run = synthetic_run(Scenario(num_requests=50, num_steps=200))
    steps = run.steps.drop(columns=["blocked", "cached_tokens", "prompt_tokens"])
    summary = {"num_requests": 50, "completed": 50}
    verdict = write_report(tmp_path, summary, run.requests, steps, pd.DataFrame(), None)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "No SLO targets" in page
    assert "no data" in page
    assert verdict["binding_limit"] == "none"


def test_cdf_marks_the_percentiles_of_the_data() -> None:
    run = synthetic_run(Scenario())
    fig = latency_cdf_figure(run.requests, run.itl)
    markers = [t for t in fig.data if t.mode == "markers"]
    assert len(markers) == 4
    ttft = run.requests["ttft_ms"].dropna().to_numpy()
    np.testing.assert_allclose(markers[0].x, np.percentile(ttft, [50, 90, 99]))
    np.testing.assert_allclose(markers[2].x, np.percentile(run.itl * 1e3, [50, 90, 99]))
    assert all(len(t.x) <= MAX_POINTS for t in fig.data)


def test_stage_bars_group_requests_without_losing_time() -> None:
    run = synthetic_run(Scenario(num_requests=5000))
    fig = stage_breakdown_figure(run.requests)
    decode = next(t for t in fig.data if t.name == "decode")
    assert len(decode.x) == MAX_BARS
    sizes = np.diff(np.append(np.asarray(decode.x) - 1, 5000))
    total = float(np.sum(np.asarray(decode.y) * sizes))
    assert total == pytest.approx(run.requests["decode_ms"].sum())


def test_prefix_hit_rate_timeline_follows_the_counters() -> None:
    run = synthetic_run(Scenario(num_steps=4000))
    half = len(run.steps) // 2
    prompt = np.arange(len(run.steps)) * 100
    cached = np.where(np.arange(len(run.steps)) < half, 0, (prompt - prompt[half]) // 2)
    steps = run.steps.assign(prompt_tokens=prompt, cached_tokens=cached)
    fig = timeline_figure(run.requests, steps, run.queues, max_running=64)
    hit = np.asarray(next(t for t in fig.data if t.name == "hit rate").y, dtype=float)
    x = np.asarray(next(t for t in fig.data if t.name == "hit rate").x, dtype=float)
    mid = steps["time"].iloc[half]
    assert np.nanmax(hit[x < mid - 1]) == 0
    assert np.nanmedian(hit[x > mid + 1]) == pytest.approx(50, abs=1)


def test_a_million_steps_make_a_bounded_report(tmp_path: Path) -> None:
    run = synthetic_run(
        Scenario(
            num_requests=50_000,
            num_steps=1_000_000,
            duration_s=3600.0,
            busy=0.93,
            waiting_fraction=0.5,
            blocked={"running_cap": 0.2},
        )
    )
    verdict = write_report(tmp_path, run.summary, run.requests, run.steps, run.queues, run.itl)
    size = (tmp_path / "report.html").stat().st_size
    assert size < 10e6
    assert verdict["binding_limit"] == "running_cap"
    fig = timeline_figure(run.requests, run.steps, run.queues, max_running=64)
    assert all(len(t.x) <= MAX_POINTS for t in fig.data)


def test_an_empty_run_still_writes_a_page(tmp_path: Path) -> None:
    empty = pd.DataFrame()
    verdict = write_report(tmp_path, {}, empty, empty, empty, np.array([]))
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert verdict["binding_limit"] == "none"
    assert "no completed requests" in page
    assert page.count("no data") >= 4
