"""The same sweep on the local pool and on a local Ray runtime (2 CPUs) gives identical rows."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import descendants, wait_gone

from lab.cli.sim import main

ray = pytest.importorskip("ray", reason="Ray is the optional 'cluster' extra")
ROOT = Path(__file__).resolve().parents[1]
GRID = """
model = "qwen3-0.6b"
max_running = [4, 32]
rate_scale = [1, 6]
"""


@pytest.mark.slow
def test_local_and_ray_rows_are_identical(tmp_path: Path) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    tables, before = {}, set()
    for name, extra in (("local", ["--jobs", "2"]), ("ray", ["--ray", "--jobs", "2"])):
        before = descendants(os.getpid())  # the local pool leaves multiprocessing's tracker
        out = tmp_path / name
        args = ["sweep", str(ROOT / "traces" / "azure_conv.csv"), "--grid", str(grid),
                "--limit", "40", "--slo-ttft-ms", "300", "--slo-tpot-ms", "20", "--no-cache",
                "--no-progress", "--out", str(out), *extra]  # fmt: skip
        assert main(args) == 0
        tables[name] = pd.read_csv(out / "sweep.csv")
        assert "executor: " + name in (out / "sweep.html").read_text()
    assert len(tables["local"]) == 4 and (tables["local"]["status"] == "ok").all()
    pd.testing.assert_frame_equal(tables["local"], tables["ray"])
    assert not ray.is_initialized()
    assert wait_gone(descendants(os.getpid()) - before, timeout=30) == set(), "Ray left processes"
