"""``sim replay`` end to end: output files and columns, fast-forward equivalence, determinism."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.cli.sim import main
from schema.metrics import REQUEST_COLUMNS
from schema.steplog import STEP_COLUMNS
from schema.traces import load_trace
from sim.config import build_config
from sim.costs import read_profile
from sim.costs.profile import COLUMNS, EMPTY_SHAPE, ProfileRow, write_profile
from sim.model.calls import replay_calls
from sim.replay import run_replay

ROOT = Path(__file__).resolve().parents[1]
SUMMARY_KEYS = {
    "num_requests", "completed", "rejected", "duration_s", "request_throughput",
    "output_throughput", "input_throughput", "goodput", "prefix_hit_rate", "ttft_ms", "tpot_ms",
    "itl_ms", "e2e_ms", "config", "cost_model", "wall_s", "num_steps", "trace",
}  # fmt: skip


def test_replay_writes_the_contracted_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    rc = main(["replay", str(ROOT / "traces" / "mooncake_conversation.jsonl"), "--limit", "40",
               "--rate-scale", "4", "--model", "qwen3-0.6b", "--slo-ttft-ms", "500",
               "--slo-tpot-ms", "50", "--no-progress", "--out", str(out)])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "ttft_ms" in printed and "roofline" in printed
    requests = pd.read_csv(out / "requests.csv")
    assert list(requests.columns)[: len(REQUEST_COLUMNS)] == list(REQUEST_COLUMNS)
    assert len(requests) == 40 and set(requests["status"]) <= {"completed", "rejected"}
    steps = pd.read_csv(out / "steps.csv")
    assert list(steps.columns) == list(STEP_COLUMNS)
    assert (steps["step"].diff().dropna() == 1).all()
    assert (steps["time"].diff().dropna() > 0).all()
    queues = pd.read_csv(out / "queues.csv")
    assert list(queues.columns) == ["time", "stage", "queue_len"]
    assert set(queues["stage"]) <= {"frontend", "tokenizer", "scheduler", "detokenizer"}
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
    assert summary["goodput"]["slo_ttft_ms"] == 500
    assert summary["cost_model"]["name"] == "roofline" and summary["cost_model"]["provenance"]
    assert summary["num_steps"] == len(steps)
    assert summary["prefix_hit_rate"] > 0  # Mooncake's hash_ids share prefixes
    assert summary["completed"] + summary["rejected"] == 40
    if importlib.util.find_spec("lab.report") is not None:
        assert (out / "report.html").is_file() and "bottleneck" in summary
    compact = tmp_path / "compact"
    rc = main(["replay", str(ROOT / "traces" / "mooncake_conversation.jsonl"), "--limit", "40",
               "--rate-scale", "4", "--model", "qwen3-0.6b", "--no-report", "--no-progress",
               "--steps", "parquet", "--out", str(compact)])  # fmt: skip
    assert rc == 0 and not (compact / "steps.csv").exists()
    parquet = pd.read_parquet(compact / "steps.parquet").astype({"blocked": str})
    csv = steps.fillna({"blocked": ""}).astype({"blocked": str})  # CSV reads "" as missing
    pd.testing.assert_frame_equal(parquet, csv, check_dtype=False)


def test_gen_then_replay_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "syn.jsonl"
    assert main(["gen", "--rate", "50", "--input", "uniform:1:300", "--output", "fixed:5",
                 "--num", "30", "--seed", "1", "--out", str(trace)]) == 0  # fmt: skip
    out = tmp_path / "o"
    assert main(["replay", str(trace), "--out", str(out), "--no-report", "--no-progress"]) == 0
    assert (pd.read_csv(out / "requests.csv")["output_tokens"] == 5).all()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{oops\n')
    assert main(["replay", str(bad), "--out", str(out)]) == 2
    assert f"{bad}:2: not valid JSON" in capsys.readouterr().err


def _frames(
    trace_path: Path, limit: int, rate_scale: float, **config: object
) -> tuple[pd.DataFrame, pd.DataFrame]:
    trace = load_trace(trace_path, limit=limit, rate_scale=rate_scale)
    result = run_replay(trace, build_config(**config), progress=False)
    return result.requests, result.steps


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize(
    ("trace", "config"),
    [
        ("azure_conv.csv", {}),
        ("azure_code.csv", {"num_tokenizers": 2}),
        ("azure_code.csv", {"layout": "inline"}),
        ("azure_conv.csv", {"layout": "frontend"}),
        ("mooncake_conversation.jsonl", {"model": "qwen3-0.6b", "num_pages": 3000}),
        ("azure_conv.csv", {"num_pages": 600, "max_running": 8, "policy": "sjf"}),
        ("azure_conv.csv", {"num_pages": 600, "reserve_decode": True}),
    ],
)
def test_fast_forward_changes_nothing(trace: str, config: dict[str, object], overlap: bool) -> None:
    path = ROOT / "traces" / trace
    on_req, on_steps = _frames(path, 150, 6.0, fast_forward=True, overlap=overlap, **config)
    off_req, off_steps = _frames(path, 150, 6.0, fast_forward=False, overlap=overlap, **config)
    assert (on_req["status"] == off_req["status"]).all()
    np.testing.assert_array_equal(on_req["output_tokens"], off_req["output_tokens"])
    np.testing.assert_array_equal(on_req["num_preemptions"], off_req["num_preemptions"])
    np.testing.assert_array_equal(on_req["cached_tokens"], off_req["cached_tokens"])
    for col in ("first_scheduled", "first_token", "finished", "detokenize_ms"):
        np.testing.assert_allclose(on_req[col], off_req[col], rtol=1e-9, atol=1e-9)
    assert len(on_steps) == len(off_steps)
    for col in ("step", "batch_size", "prefill_tokens", "decode_requests", "context_tokens",
                "kv_pages_used", "num_running", "num_waiting", "preempted", "cached_tokens",
                "prompt_tokens"):  # fmt: skip
        np.testing.assert_array_equal(on_steps[col], off_steps[col])
    np.testing.assert_array_equal(on_steps["blocked"].astype(str), off_steps["blocked"].astype(str))
    np.testing.assert_allclose(on_steps["time"], off_steps["time"], rtol=1e-9)
    assert (on_req["output_tokens"][on_req["status"] == "completed"] > 0).all()


def test_replay_is_deterministic() -> None:
    path = ROOT / "traces" / "azure_code.csv"
    a_req, a_steps = _frames(path, 120, 3.0)
    b_req, b_steps = _frames(path, 120, 3.0)
    pd.testing.assert_frame_equal(a_req, b_req)
    pd.testing.assert_frame_equal(a_steps, b_steps)


def test_overload_is_reported_not_dropped(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 0, "output_length": 4},
        {"timestamp": 1, "input_length": 40, "output_length": 0},
        {"timestamp": 2, "input_length": 5000, "output_length": 10},
        {"timestamp": 3, "input_length": 100, "output_length": 10},
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_replay(load_trace(trace), build_config(num_pages=64), progress=False)
    req = result.requests.set_index("rid")
    assert list(req["status"]) == ["rejected", "rejected", "rejected", "completed"]
    assert "empty prompt" in req.loc["L1", "reason"]
    assert "max_new_tokens" in req.loc["L2", "reason"]
    assert "KV pages" in req.loc["L3", "reason"]
    assert result.summary["rejected"] == 3 and len(result.summary["rejected_reasons"]) == 3


@pytest.mark.parametrize("overlap", [False, True])
def test_preemption_under_page_pressure_completes_identically(
    tmp_path: Path, overlap: bool
) -> None:
    trace = tmp_path / "burst.jsonl"
    rows = [
        {"timestamp": i, "input_length": 40 + i, "output_length": 120 + 7 * i} for i in range(6)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = {
        ff: run_replay(
            load_trace(trace),
            build_config(num_pages=30, fast_forward=ff, overlap=overlap),
            progress=False,
        )
        for ff in (True, False)
    }
    on, off = results[True].requests, results[False].requests
    assert (on["status"] == "completed").all()
    assert on["num_preemptions"].sum() > 0
    assert list(on["output_tokens"]) == [r["output_length"] for r in rows]
    np.testing.assert_array_equal(on["num_preemptions"], off["num_preemptions"])
    np.testing.assert_allclose(on["finished"], off["finished"], rtol=1e-9)
    assert results[True].summary["fast_forward"]["runs"] > 0


@pytest.mark.parametrize("overlap", [False, True])
def test_the_engine_loop_s_calls_replay_on_a_fresh_core(overlap: bool) -> None:
    config = build_config(num_pages=400, overlap=overlap)
    trace = load_trace(ROOT / "traces" / "azure_conv.csv", limit=60, rate_scale=8.0)
    result = run_replay(trace, config, record_calls=True, progress=False)
    outstanding: list[int] = []
    most = 0
    for call in result.scheduler.calls:
        if call.name == "schedule":
            assert len(outstanding) <= (1 if overlap else 0), "schedule with too much in flight"
            outstanding.append(call.result.step)
        elif call.name == "complete":
            assert call.args[0] == outstanding.pop(0), "plans complete in the order made"
        elif call.name == "advance_decode":  # with a plan in flight, the run's last stays
            in_flight = call.result.in_flight
            assert len(outstanding) == (in_flight is not None)
            outstanding = [in_flight.step] if in_flight is not None else []
        most = max(most, len(outstanding))
    assert most == (2 if overlap else 1) and not outstanding
    assert replay_calls(result.scheduler.calls, config.scheduler_config()) == []
    steps = result.steps  # one GPU: a step starts after the previous one ends
    ends = (steps["time"] + steps["duration_s"]).to_numpy()
    assert (steps["time"].to_numpy()[1:] >= ends[:-1] - 1e-12).all()


def test_the_simulator_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, lab.cli.sim, sim.replay; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_replay_with_a_table_profile_names_it(tmp_path: Path) -> None:
    """A profile in the format written before ``device_s`` existed still reads."""
    profile = tmp_path / "prof.csv"
    rows = ["# hardware: test gpu", "# model: llama-3.1-8b", "# date: 2026-11-29",
            "# command: written by this test",
            ",".join(COLUMNS[:-1]), "prefill,512,0,512,0,0,131328,1,1,0.012,0.011,0.013,3,fit",
            "prefill,4096,0,4096,0,0,8390656,1,1,0.09,0.09,0.09,3,fit",
            "decode,0,1,1000,1000,1000,0,1,1,0.004,0.004,0.004,3,fit",
            "decode,0,64,80000,80000,80000,0,64,1,0.007,0.007,0.007,3,fit",
            "mixed,256,32,30000,29744,29760,32896,33,1,0.011,0.011,0.011,3,fit",
            "ipc,0,0,0,0,0,0,0,1,5e-5,5e-5,5e-5,1,fit"]  # fmt: skip
    profile.write_text("\n".join(rows) + "\n")
    out = tmp_path / "o"
    args = ["replay", str(ROOT / "traces" / "azure_code.csv"), "--limit", "20", "--profile",
            str(profile), "--no-report", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cost_model"]["name"] == "table"
    assert summary["cost_model"]["profile"] == str(profile)
    assert "hardware: test gpu" in summary["cost_model"]["provenance"]
    assert summary["cpu_costs"]["ipc"] == 5e-5 and summary["completed"] == 20


def test_overlap_prices_device_time_on_the_gpu_and_host_time_on_the_cpu(tmp_path: Path) -> None:
    """A profile whose device times are 60 % of its wall times: overlapped decode steps
    follow the device time (the host's 40 % hides under the step before), strict ones the
    wall time; fast-forwarded runs price exactly what single steps price."""
    measured = read_profile(ROOT / "profiles" / "h200_llama-3.1-8b.csv")
    rows = [replace(r, device_s=0.6 * r.duration_s) for r in measured.steps]
    rows += [ProfileRow(k, EMPTY_SHAPE, 1, v, v, v, 1) for k, v in measured.cpu.items()]
    profile = tmp_path / "device.csv"
    write_profile(profile, measured.provenance, rows)
    path = ROOT / "traces" / "azure_conv.csv"
    tpot = {}
    for overlap in (False, True):
        frames = [
            _frames(
                path,
                60,
                2.0,
                model="llama-3.1-8b",
                profile=str(profile),
                num_pages=20000,
                overlap=overlap,
                fast_forward=ff,
            )
            for ff in (True, False)
        ]
        (on_req, on_steps), (off_req, off_steps) = frames
        np.testing.assert_allclose(on_req["e2e_ms"], off_req["e2e_ms"], rtol=1e-9)
        np.testing.assert_allclose(on_steps["duration_s"], off_steps["duration_s"], rtol=1e-9)
        tpot[overlap] = float(on_req["tpot_ms"].median())
    assert tpot[True] < 0.75 * tpot[False]


def test_the_printed_provenance_is_the_fit_not_the_profile_header() -> None:
    from lab.replay.summary import short_provenance

    fit = "piecewise-linear fit to 9 step rows; fit error over 9 rows: mean 2.0%"
    whole = f"{fit}: hardware: 1x NVIDIA H200; model: llama-3.1-8b; command: engine profile ..."
    assert short_provenance(whole) == f"{fit} (whole: summary.json, cost_model.provenance)"
    assert short_provenance("roofline of h200") == "roofline of h200"
    long = short_provenance("x " * 400)
    assert len(long) < 300 and long.endswith("cost_model.provenance)")
