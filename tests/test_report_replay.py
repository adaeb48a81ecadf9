"""The report on a real ``sim replay`` output, read back from its CSV files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lab.report import bottleneck_verdict, write_report
from lab.report.verdict import LIMIT_LABELS

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "azure_conv.csv"


@pytest.fixture(scope="module")
def replay_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sim = Path(sys.executable).with_name("sim")
    if not TRACE.is_file() or not (sim.is_file() or shutil.which("sim")):
        pytest.skip("needs the sim command and traces/azure_conv.csv")
    out = tmp_path_factory.mktemp("replay")
    cmd = [str(sim if sim.is_file() else "sim"), "replay", str(TRACE), "--limit", "300"]
    cmd += ["--rate-scale", "20", "--slo-ttft-ms", "500", "--slo-tpot-ms", "20"]
    cmd += ["--out", str(out), "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120, cwd=ROOT)
    return out


def test_report_reads_a_replay_from_its_csv_files(replay_dir: Path, tmp_path: Path) -> None:
    summary = json.loads((replay_dir / "summary.json").read_text())
    summary.pop("bottleneck", None)
    requests = pd.read_csv(replay_dir / "requests.csv")
    steps = pd.read_csv(replay_dir / "steps.csv")
    queues = pd.read_csv(replay_dir / "queues.csv")
    verdict = write_report(tmp_path, summary, requests, steps, queues, None)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert verdict["binding_limit"] in LIMIT_LABELS
    assert verdict["text"].split(" ")[0] in page
    assert 0 <= verdict["slo"]["meets_both"] <= verdict["slo"]["meets_ttft"] <= 1
    assert sum(verdict["stage_shares"].values()) == pytest.approx(1.0, abs=0.05)
    pure = bottleneck_verdict(summary, requests, steps, queues)
    assert pure["binding_limit"] == verdict["binding_limit"]
    assert pure["evidence"]["busy_fraction"] <= 1.0 + 1e-6
