"""The reports fit a laptop's window, measured in headless Chromium (``lab.report.fits``);
and how a page loads plotly.js (``lab.report.plotlyjs``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.cli.sim import main as sim
from lab.report.capacity_page import COLUMNS, write_capacity_page
from lab.report.fits import Fit, find_chromium, measure
from lab.report.fits import main as fits_main
from lab.report.page import Section, write_page
from lab.report.plotlyjs import PLOTLY_FILE, PlotlyJs

ROOT = Path(__file__).resolve().parents[1]
LAPTOP = 1280
SWEEP_GRID = """
policy = ["fcfs", "sjf"]
rate_scale = [2, 8]

[scheduler]
max_running = [8, 64]
"""


@pytest.fixture(scope="module")
def chromium() -> str:
    found = find_chromium()
    if found is None:
        pytest.skip("no Chromium binary (chromium, chromium-browser, google-chrome or $CHROMIUM)")
    return found


def _fits(fit: Fit) -> None:
    assert fit.fits, "\n".join(fit.lines())
    assert fit.figures > 0, "plotly.js did not draw the figures"


def test_the_replay_report_fits_a_laptop(tmp_path: Path, chromium: str) -> None:
    """``sim replay`` on a slice of a real trace: the page (self-contained, the default)
    fits 1,280 px, its run configuration with the cost model's long provenance included."""
    out = tmp_path / "replay"
    trace = ROOT / "traces" / "azure_conv.csv"
    args = ["replay", str(trace), "--limit", "200", "--slo-ttft-ms", "300", "--slo-tpot-ms",
            "10", "--steps", "none", "--no-progress", "--out", str(out)]  # fmt: skip
    assert sim(args) == 0
    page = out / "report.html"
    assert not (out / PLOTLY_FILE).exists()  # inline by default
    _fits(measure(page, LAPTOP, chromium=chromium))


def test_the_sweep_page_fits_a_laptop(tmp_path: Path, chromium: str) -> None:
    grid, out = tmp_path / "g.toml", tmp_path / "sweep"
    grid.write_text(SWEEP_GRID)
    args = ["sweep", str(ROOT / "traces" / "azure_code.csv"), "--grid", str(grid), "--limit",
            "30", "--jobs", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    assert sim(args) == 0
    _fits(measure(out / "sweep.html", LAPTOP, chromium=chromium))


def test_a_capacity_page_with_every_column_fits_a_laptop(tmp_path: Path, chromium: str) -> None:
    """The widest capacity table there is (every column, three configurations) fits without
    scrolling sideways; its legend names each column."""
    rng = np.random.default_rng(0)
    rows = []
    for config_id in range(3):
        scale = float(rng.uniform(0.2, 3))
        row: dict[str, object] = {c: float(rng.uniform(0.9, 1)) for c in COLUMNS}
        row.update(config_id=config_id, max_running=[16, 64, 256][config_id], probes=14,
                   max_rate_scale=scale, max_request_rate=5.53 * scale,
                   replicas_even_split=int(np.ceil(1 / scale)), replicas_simulated=3,
                   replicas_simulated_rate_scale=1.0, first_failing_scale=1.02 * scale,
                   crossing_scale=1.01 * scale, ttft_ms_p90_at_max=float(rng.uniform(50, 4000)),
                   tpot_ms_p90_at_max=float(rng.uniform(5, 80)),
                   binding_limit_at_max="prefill_budget", binding_limit_above="gpu_compute",
                   ttft_stage_above="scheduler_wait", replicas_simulated_note="",
                   error="")  # fmt: skip
        rows.append(row)
    capacity = pd.DataFrame(rows)
    scales = [0.125, 0.25, 0.5, 1.0, 2.0, 4.0]
    probes = pd.DataFrame(
        [{"config_id": c, "rate_scale": x, "slo_attainment": max(0.0, 1 - 0.05 * x * (c + 1)),
          "binding_limit": "none", "ttft_ms_p99": 40 * x * x, "tpot_ms_p99": 8 + x}
         for c in range(3) for x in scales]
    )  # fmt: skip
    write_capacity_page(tmp_path, "sim capacity: t", "sub", capacity, probes, ["max_running"],
                        0.99, (300.0, 10.0), PlotlyJs("directory"))  # fmt: skip
    page = tmp_path / "capacity.html"
    assert "<dt>replicas sim</dt>" in page.read_text()
    fit = measure(page, LAPTOP, chromium=chromium)
    _fits(fit)
    assert not fit.boxes, fit.lines()  # fits without a scrollbar of its own


def test_a_page_too_wide_fails_with_the_element(tmp_path: Path, chromium: str) -> None:
    wide = "<pre id='dump'>" + "coefficient=0.000123;" * 200 + "</pre>"
    write_page(tmp_path / "wide.html", "wide", "<h1>wide</h1>", [Section("Run", "a", wide)])
    fit = measure(tmp_path / "wide.html", LAPTOP, chromium=chromium)
    assert not fit.fits and fit.page_width > LAPTOP
    assert any(w["element"].startswith("pre#dump") for w in fit.wide), fit.lines()
    assert fits_main([str(tmp_path / "wide.html"), "--width", str(LAPTOP)]) == 1


def test_pages_of_one_tree_share_one_plotly_copy(tmp_path: Path, chromium: str) -> None:
    """``directory`` mode: one plotly.min.js at the tree's root, loaded by a relative path
    (the pages draw their figures in the browser); the pages stay small."""
    shared = PlotlyJs("directory", tmp_path)
    body = "<div id='x'></div><script>Plotly.newPlot('x', [{y: [1, 3, 2]}])</script>"
    for name in ("real-1", "real-2", "sim"):
        write_page(tmp_path / name / "report.html", name, "", [Section("S", "n", body)], shared)
    assert [p.name for p in tmp_path.rglob("*.js")] == [PLOTLY_FILE]
    page = tmp_path / "sim" / "report.html"
    assert f"src='../{PLOTLY_FILE}'" in page.read_text()
    assert page.stat().st_size < 20_000
    assert measure(page, LAPTOP, chromium=chromium).figures == 1


def test_cdn_mode_links_the_installed_plotly_version(tmp_path: Path) -> None:
    from plotly.offline import get_plotlyjs_version

    write_page(tmp_path / "r.html", "r", "", [], PlotlyJs("cdn"))
    text = (tmp_path / "r.html").read_text()
    assert f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js" in text
    assert len(text) < 10_000 and not (tmp_path / PLOTLY_FILE).exists()
    with pytest.raises(ValueError, match="one of inline, directory, cdn"):
        PlotlyJs("embedded")
