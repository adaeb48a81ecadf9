"""``scripts/frontend_shared_loop.py``: a run's intake served by one loop that also streams."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from frontend_shared_loop import shared_loop_intake  # noqa: E402

from sim.config import build_config  # noqa: E402
from sim.replay import build_costs  # noqa: E402

PROFILE = ROOT / "reports" / "cluster" / "h200_shared_gpu" / "edge50" / "host_cpu.csv"


def test_an_intake_waits_for_the_chunks_before_it_and_not_for_those_after() -> None:
    """Ten chunks of 1 ms at t=0 hold the loop until 10 ms: a request arriving at 1 ms is
    parsed (2 ms) at 12 ms, 11 ms after it came; the chunks at 20 ms come after a request
    arriving at 15 ms, which waits for nothing; two requests at once queue one behind the
    other (no hops, no detokenizer: the chunks reach the loop as the steps end)."""
    config = build_config(None, model="qwen3-0.6b")
    cpu = replace(build_costs(config)[1], frontend=0.002, stream=0.001, ipc=0.0, detokenize=0.0)
    arrivals = np.array([0.001, 0.015, 0.030, 0.030])
    intake = shared_loop_intake(arrivals, np.array([0.020, 0.0]), np.array([5, 10]), cpu)
    assert intake == pytest.approx([0.011, 0.002, 0.002, 0.004])
    alone = shared_loop_intake(arrivals, np.array([]), np.array([]), cpu)
    assert alone == pytest.approx([0.002, 0.002, 0.002, 0.004])


def test_the_script_reads_a_run_and_a_profile(tmp_path: Path) -> None:
    pd.DataFrame({"arrival": [0.0, 0.5], "frontend_ms": [2.0, 30.0]}).to_csv(
        tmp_path / "requests.csv", index=False
    )
    steps = {"time": [0.1, 0.4], "duration_s": [0.01, 0.09], "batch_size": [4, 200]}
    pd.DataFrame(steps).to_csv(tmp_path / "steps.csv", index=False)
    script = str(ROOT / "scripts" / "frontend_shared_loop.py")
    done = subprocess.run([sys.executable, script, str(tmp_path), "--cpu-profile", str(PROFILE)],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "2 requests, 204 chunks" in done.stdout and "one loop, streaming beside" in done.stdout
    bad = subprocess.run([sys.executable, script, str(tmp_path / "none"), "--cpu-profile",
                          str(PROFILE)], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert bad.returncode == 2 and "error" in bad.stderr
