"""``sim sweep``: grids, the table on a slice of a real trace, failures, the cache, executors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.cli.sim import main
from lab.sweep.executor import LocalPool
from lab.sweep.grid import check_grid, expand, read_grid
from lab.sweep.sweep import pareto_front

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "azure_code.csv"
GRID = """
model = "qwen3-0.6b"
policy = ["fcfs", "sjf"]
rate_scale = [2, 8]

[scheduler]
kv_memory_gb = [20, 1e-9]   # the second leaves no room for one KV page: it fails
"""


def test_grid_reads_sections_and_expands_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(GRID)
    grid = read_grid(path)
    assert list(grid) == ["model", "policy", "rate_scale", "kv_memory_gb"]
    points = expand(grid)
    assert len(points) == 8 and points[0] == {
        "model": "qwen3-0.6b", "policy": "fcfs", "rate_scale": 2, "kv_memory_gb": 20,
    }  # fmt: skip
    assert [p["kv_memory_gb"] for p in points[:2]] == [20, 1e-9]  # the last key varies fastest


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"max_runing": [8]}, "unknown knobs ['max_runing']; known: "),
        ({"policy": []}, "empty list"),
        ({"policy": [["fcfs"]]}, "scalar values"),
    ],
)
def test_grid_errors_are_clear(knobs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_grid(knobs)


def test_an_unknown_knob_stops_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text("reservation = [0, 0.1]\n")
    assert main(["sweep", str(TRACE), "--grid", str(grid), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown knobs ['reservation']" in err and "max_prefill_tokens" in err


def test_pareto_front_by_hand() -> None:
    throughput = np.array([10.0, 20.0, 15.0, 20.0, np.nan])
    latency = np.array([1.0, 5.0, 6.0, 4.0, 1.0])
    # 2 is beaten by 1 and 3; 1 is beaten by 3 (same throughput, lower latency); NaN is out
    assert list(pareto_front(throughput, latency)) == [True, False, False, True, False]


def test_sweep_on_a_real_trace_reports_failures_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid, out = tmp_path / "g.toml", tmp_path / "out"
    grid.write_text(GRID)
    args = ["sweep", str(TRACE), "--grid", str(grid), "--limit", "60", "--slo-ttft-ms", "400",
            "--slo-tpot-ms", "20", "--jobs", "2", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 8 and list(table["config_id"]) == list(range(8))
    parquet = pd.read_parquet(out / "sweep.parquet")
    parquet["error"] = parquet["error"].replace("", np.nan)  # CSV reads an empty cell as NaN
    pd.testing.assert_frame_equal(table, parquet, check_dtype=False)
    failed = table[table["status"] == "failed"]
    assert list(failed["kv_memory_gb"]) == [1e-9] * 4
    assert failed["error"].str.contains("leaves no memory for the KV cache").all()
    assert failed["error"].str.startswith("invalid configuration: ValueError").all()
    assert "failed: config 1: invalid configuration" in printed
    ok = table[table["status"] == "ok"]
    assert (ok["completed"] == 60).all() and ok["binding_limit"].notna().all()
    assert (ok["goodput"] <= ok["request_throughput"] + 1e-9).all()
    assert ok["slo_attainment"].between(0, 1).all()
    # replaying 8x faster raises throughput over the same requests
    by_scale = ok.groupby("rate_scale")["request_throughput"].mean()
    assert by_scale[8] > 2 * by_scale[2]
    assert ok["pareto_ttft"].any() and not failed["pareto_ttft"].any()
    page = (out / "sweep.html").read_text()
    assert "Pareto fronts" in page and "leaves no memory" in page

    cached = sorted((out / "cache").glob("*.json"))
    assert len(cached) == 4  # failures are not cached: a rerun retries them
    row = json.loads(cached[0].read_text())
    row["goodput"] = 12345.0  # a rerun reads the cache instead of replaying
    cached[0].write_text(json.dumps(row))
    assert main(args) == 0
    again = pd.read_csv(out / "sweep.csv")
    assert (again["goodput"] == 12345.0).sum() == 1
    assert again.drop(columns=["goodput", "pareto_ttft", "pareto_tpot"]).equals(
        table.drop(columns=["goodput", "pareto_ttft", "pareto_tpot"])
    )


def _square_or_die(shared: int, task: int) -> int:
    """A task for the pool: ``task * task + shared``; task 3 kills its worker."""
    if task == 3:
        os._exit(1)
    return task * task + shared


def test_local_pool_reports_a_dead_worker_and_goes_on() -> None:
    pool = LocalPool(jobs=1)
    results = dict(pool.run(_square_or_die, 10, [1, 2, 3, 4, 5], lambda t, m: f"{t}: {m}"))
    assert results[0] == 11 and results[1] == 14 and results[3] == 26 and results[4] == 35
    assert str(results[2]).startswith("3: a worker process died")
