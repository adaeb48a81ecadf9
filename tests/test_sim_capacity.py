"""``sim capacity``: bisection finds a capacity computed by hand; capacity on a real trace."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from lab.cli.sim import main
from lab.report.verdict import LIMIT_LABELS
from schema.traces import load_trace
from sim.config import build_config

ROOT = Path(__file__).resolve().parents[1]
N, GAP_MS, PROMPT, TOKENIZE_S = 200, 3.0, 100, 1e-4
CPU_COSTS = """# hardware: none (round numbers for a test)
# model: none
# date: 2026-11-30
# command: written by tests/test_sim_capacity.py
kind,prefill_tokens,decode_requests,context_tokens,decode_context,decode_padded,prefill_attention,sampled,tp,duration_s,min_s,max_s,repeats,split
tokenize,0,0,0,0,0,0,0,1,{tokenize},{tokenize},{tokenize},1,fit
detokenize,0,0,0,0,0,0,0,1,1e-7,1e-7,1e-7,1,fit
ipc,0,0,0,0,0,0,0,1,1e-6,1e-6,1e-6,1,fit
frontend,0,0,0,0,0,0,0,1,1e-6,1e-6,1e-6,1,fit
schedule,0,0,0,0,0,0,0,1,0,0,0,1,fit
schedule_request,0,0,0,0,0,0,0,1,0,0,0,1,fit
stream,0,0,0,0,0,0,0,1,0,0,0,1,fit
"""


def _tokenizer_bound(tmp_path: Path) -> tuple[Path, Path]:
    """The trace and config of the test above: one replica serves 0.3x the trace's rate."""
    trace, costs = tmp_path / "even.jsonl", tmp_path / "cpu.csv"
    rows = [{"timestamp": i * GAP_MS, "input_length": PROMPT, "output_length": 2} for i in range(N)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    costs.write_text(CPU_COSTS.format(tokenize=TOKENIZE_S))
    config = tmp_path / "c.toml"
    config.write_text(f'model = "smollm2-135m"\ncpu_profile = "{costs}"\n')
    return trace, config


def test_bisection_finds_the_tokenizer_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The capacity by hand.

    ``N`` = 200 requests arrive every ``GAP_MS`` = 3 ms, each with a 100-token
    prompt; one tokenizer worker takes 1e-4 s a token, so 10 ms a request. At
    rate scale ``x`` they arrive every ``3 / x`` ms: the tokenizer keeps up
    while ``3 / x >= 10``, i.e. ``x <= 0.3``, and every TTFT is the same
    ``c`` = tokenize (10 ms) + frontend, IPC and a ~0.1 ms prefill step of
    SmolLM2-135M, about 10.2 ms. Above 0.3 request ``n`` waits ``n * (10 - 3 /
    x)`` ms for the tokenizer. With a 15 ms TTFT SLO (slack ``d`` = 15 - c <
    4.8 ms) and 99% attainment, requests 0..197 must meet it: ``197 * (10 - 3
    / x) <= d``, so the boundary ``b`` lies in ``[0.3, 3 / (10 - 4.8 / 197)] =
    [0.3, 0.30073]``. Bisection stops with ``lo <= b < hi`` and ``hi / lo <=
    1.02``: ``0.3 / 1.02 < lo <= 0.30073``, and the trace's own rate needs
    ``ceil(1 / lo)`` = 4 replicas.
    """
    trace, config = _tokenizer_bound(tmp_path)
    out = tmp_path / "out"
    args = ["capacity", str(trace), "--config", str(config), "--slo-ttft-ms", "15",
            "--slo-tpot-ms", "50", "--jobs", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    cap = pd.read_csv(out / "capacity.csv").iloc[0]
    boundary_low = GAP_MS / (PROMPT * TOKENIZE_S * 1e3)
    assert boundary_low == pytest.approx(0.3)
    assert boundary_low / 1.02 < cap["max_rate_scale"] <= 3 / (10 - 4.8 / 197)
    assert cap["first_failing_scale"] / cap["max_rate_scale"] <= 1.02 + 1e-12
    assert cap["max_rate_scale"] <= cap["crossing_scale"] <= cap["first_failing_scale"]
    assert cap["replicas_even_split"] == 4 == math.ceil(1 / cap["max_rate_scale"])
    rate = N / ((N - 1) * GAP_MS / 1e3)
    assert cap["max_request_rate"] == pytest.approx(cap["max_rate_scale"] * rate)
    probes = pd.read_csv(out / "probes.csv")
    assert {0.25, 0.5, 1.0} <= set(probes["rate_scale"])  # 1 and 0.5 fail, 0.25 passes
    assert probes.set_index("rate_scale").loc[0.5, "binding_limit"] == "tokenizer"
    assert (probes["passed"] == (probes["rate_scale"] <= cap["max_rate_scale"])).all()
    assert "replicas" in capsys.readouterr().out
    assert "Capacity" in (out / "capacity.html").read_text()


def test_a_grid_over_replicas_keeps_its_knob_and_draws_a_curve_each(tmp_path: Path) -> None:
    """``replicas`` is a config key: its column is the knob, beside the even-split estimate,
    and the page draws the edge and the P99 tails per replica count."""
    trace, config = _tokenizer_bound(tmp_path)
    grid, out = tmp_path / "grid.toml", tmp_path / "out"
    grid.write_text("replicas = [1, 2]\n")
    args = ["capacity", str(trace), "--config", str(config), "--grid", str(grid),
            "--slo-ttft-ms", "15", "--slo-tpot-ms", "50", "--tolerance", "0.1", "--jobs", "1",
            "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    cap = pd.read_csv(out / "capacity.csv").sort_values("replicas")
    assert list(cap["replicas"]) == [1, 2]
    assert cap["max_rate_scale"].iloc[1] > cap["max_rate_scale"].iloc[0]  # two tokenizer pools
    assert list(cap["replicas_even_split"]) == [math.ceil(1 / x) for x in cap["max_rate_scale"]]
    page = (out / "capacity.html").read_text()
    assert "Attainment at the edge" in page and "TTFT P99 (ms)" in page and "TPOT P99" in page


def _attainment(trace: Path, config: Path, replicas: int) -> float:
    from sim.replay import run_replay

    sim_config = build_config(config, replicas=replicas, slo_ttft_ms=15, slo_tpot_ms=50)
    summary = run_replay(load_trace(trace), sim_config, progress=False).summary
    return float(summary["goodput"]["attainment"])


def test_replica_search_simulates_the_cluster(tmp_path: Path) -> None:
    """Round robin over ``n`` replicas gives each a request every ``3 n`` ms: 4 keep up with
    the 10 ms tokenizer, 3 do not (each replica's queue grows 1 ms a request)."""
    trace, config = _tokenizer_bound(tmp_path)
    out = tmp_path / "out"
    args = ["capacity", str(trace), "--config", str(config), "--slo-ttft-ms", "15",
            "--slo-tpot-ms", "50", "--tolerance", "0.1", "--replicas-search", "--router",
            "round_robin", "--jobs", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    cap = pd.read_csv(out / "capacity.csv").iloc[0]
    n = int(cap["replicas_simulated"])
    assert n == 4 and cap["attainment_one_fewer"] < 0.99 <= cap["attainment_at_replicas"]
    assert _attainment(trace, config, n) >= 0.99 > _attainment(trace, config, n - 1)
    probes = pd.read_csv(out / "replica_probes.csv")
    assert (
        set(probes["replicas"]) >= {3, 4} and (probes["passed"] == (probes["replicas"] >= 4)).all()
    )
    assert "replicas_simulated" in (out / "capacity.html").read_text()
    # too few replicas allowed: not met
    assert main([*args, "--max-replicas", "2"]) == 0  # the rate-scale probes are cached
    few = pd.read_csv(out / "capacity.csv").iloc[0]
    assert pd.isna(few["replicas_simulated"])
    assert few["replicas_simulated_note"].startswith("not met at any replica count up to 2")


def test_replica_search_not_met_when_one_request_misses(tmp_path: Path) -> None:
    """A 5 ms TTFT SLO under a request's own ~10.2 ms TTFT: no replica count helps."""
    trace, config = _tokenizer_bound(tmp_path)
    out = tmp_path / "out"
    args = ["capacity", str(trace), "--config", str(config), "--slo-ttft-ms", "5",
            "--slo-tpot-ms", "50", "--replicas-search", "--limit", "40", "--jobs", "1",
            "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    cap = pd.read_csv(out / "capacity.csv").iloc[0]
    assert pd.isna(cap["replicas_simulated"]) and cap["replica_probes"] == 0
    assert cap["replicas_simulated_note"].startswith("not met at any replica count")
    assert "TTFT P99 10." in cap["replicas_simulated_note"]


def test_capacity_on_a_slice_of_a_real_trace(tmp_path: Path) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text("max_running = [4, 64]\n")
    out = tmp_path / "out"
    args = ["capacity", str(ROOT / "traces" / "azure_conv.csv"), "--grid", str(grid),
            "--limit", "150", "--slo-ttft-ms", "200", "--slo-tpot-ms", "20", "--tolerance",
            "0.1", "--jobs", "2", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    cap = pd.read_csv(out / "capacity.csv").set_index("max_running")
    assert (cap["status"] == "ok").all() and (cap["max_rate_scale"] > 0).all()
    # four requests at a time serve far less of this traffic than 64
    assert cap.loc[4, "max_rate_scale"] * 10 < cap.loc[64, "max_rate_scale"]
    assert (cap["first_failing_scale"] / cap["max_rate_scale"] <= 1.1 + 1e-12).all()
    assert set(cap["binding_limit_above"]) <= set(LIMIT_LABELS)
    assert (cap["attainment_at_max"] >= 0.99).all() and (cap["attainment_above"] < 0.99).all()


def test_capacity_rejects_a_rate_scale_knob(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text("rate_scale = [1, 2]\n")
    args = ["capacity", str(ROOT / "traces" / "azure_code.csv"), "--grid", str(grid),
            "--slo-ttft-ms", "200", "--slo-tpot-ms", "20", "--out", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    assert "leave rate_scale out of the grid" in capsys.readouterr().err
