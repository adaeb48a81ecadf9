"""The simulated cluster: replicas of the pipeline behind one router core (sim.model.cluster)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.cli.sim import main
from schema.metrics import TIME_COLUMNS
from schema.traces import Trace, load_trace
from schema.traces.record import TraceRequest
from sim.config import build_config
from sim.replay import run_replay

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "traces" / "mooncake_conversation.jsonl"
SAME = ("rid", "status", "input_tokens", "output_tokens", "cached_tokens", "num_preemptions")


def _assert_same_requests(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Same statuses and token counts; every time within 1e-9 s."""
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    for col in SAME:
        assert a[col].tolist() == b[col].tolist(), col
    for col in TIME_COLUMNS:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        assert (np.isnan(x) == np.isnan(y)).all(), col
        assert np.nanmax(np.abs(x - y), initial=0.0) <= 1e-9, col


@pytest.fixture(scope="module")
def mooncake() -> Trace:
    return load_trace(MOONCAKE, limit=150, rate_scale=2.0)


@pytest.mark.parametrize("overlap", [False, True])
def test_one_replica_cluster_is_the_single_pipeline(mooncake: Trace, overlap: bool) -> None:
    # without the frontend's loop (with it, one server runs as a cluster of one too)
    config = build_config(None, model="qwen3-0.6b", overlap=overlap, router="cache_aware",
                          frontend_loop=False)  # fmt: skip
    single = run_replay(mooncake, config, progress=False)
    cluster = run_replay(mooncake, config, progress=False, cluster=True)
    _assert_same_requests(single.requests, cluster.requests)
    pd.testing.assert_frame_equal(single.steps, cluster.steps)
    assert cluster.router is not None and cluster.router.outstanding == 0
    assert single.summary["prefix_hit_rate"] == cluster.summary["prefix_hit_rate"]


@pytest.mark.parametrize("overlap", [False, True])
def test_round_robin_replicas_each_replay_their_share(mooncake: Trace, overlap: bool) -> None:
    """Round robin places request i on replica i mod N whatever the load, and each replica has
    its own frontend, tokenizers and scheduler: replica k is a single server replaying its
    share of the trace, exactly."""
    n = 3
    config = build_config(None, model="qwen3-0.6b", overlap=overlap, replicas=n)
    cluster = run_replay(mooncake, config, progress=False)
    counts = cluster.requests["replica"].value_counts().sort_index().tolist()
    assert max(counts) - min(counts) <= 1 and sum(counts) == len(mooncake.requests)
    one = replace(config, replicas=1)
    for k in range(n):
        share = replace(mooncake, requests=mooncake.requests[k::n])
        alone = run_replay(share, one, progress=False)
        mine = cluster.requests[cluster.requests["replica"] == k]
        _assert_same_requests(alone.requests, mine)
        steps = cluster.steps[cluster.steps["replica"] == k].drop(columns="replica")
        pd.testing.assert_frame_equal(alone.steps, steps.reset_index(drop=True), atol=1e-9)
        assert cluster.summary["replicas"][k]["requests"] == len(share.requests)


@pytest.mark.parametrize("policy", ["least_outstanding", "cache_aware", "power_of_two"])
def test_fast_forward_changes_nothing_in_a_cluster(mooncake: Trace, policy: str) -> None:
    """Decode runs cut by requests the router sends meanwhile give the step-by-step results."""
    config = build_config(None, model="qwen3-0.6b", replicas=3, router=policy)
    fast = run_replay(mooncake, config, progress=False)
    slow = run_replay(mooncake, replace(config, fast_forward=False), progress=False)
    assert fast.summary["fast_forward"]["steps_in_runs"] > 0
    _assert_same_requests(fast.requests, slow.requests)
    assert fast.requests["replica"].tolist() == slow.requests["replica"].tolist()


def _shared_prefix_trace(groups: int, per_group: int) -> Trace:
    """Requests of ``groups`` documents: 6 shared 512-token blocks each, then 2 of their own."""
    rng = np.random.default_rng(0)
    order = rng.permutation(np.repeat(np.arange(groups), per_group))
    requests = [
        TraceRequest(
            rid=f"r{i}",
            arrival=0.05 * i,
            input_length=8 * 512,
            output_length=16,
            hash_ids=(*(1000 * g + b for b in range(6)), 10**6 + 2 * i, 10**6 + 2 * i + 1),
        )
        for i, g in enumerate(order)
    ]
    return Trace("synthetic-prefixes", "jsonl", requests)


def test_cache_aware_hits_the_prefix_cache_more_than_round_robin() -> None:
    """32 documents over 4 replicas: round robin sends most documents to several replicas (a
    miss on each), cache_aware keeps each on one (a miss on its first request only)."""
    trace = _shared_prefix_trace(groups=32, per_group=6)
    rates = {}
    for policy in ("round_robin", "cache_aware"):
        config = build_config(None, model="qwen3-0.6b", replicas=4, router=policy)
        result = run_replay(trace, config, progress=False)
        rates[policy] = result.summary["prefix_hit_rate"]
        assert result.router is not None and result.router.outstanding == 0
    assert rates["cache_aware"] > rates["round_robin"] + 0.15, rates


def test_the_router_s_books_are_empty_at_the_end_rejections_included() -> None:
    trace = _shared_prefix_trace(groups=4, per_group=10)
    huge = TraceRequest("huge", 0.12, 400 * 512, 16)
    trace = replace(trace, requests=sorted([*trace.requests, huge], key=lambda r: r.arrival))
    config = build_config(None, model="qwen3-0.6b", replicas=3, router="least_outstanding",
                          num_pages=4096)  # fmt: skip
    result = run_replay(trace, config, progress=False)
    router = result.router
    assert router is not None
    status = dict(zip(result.requests["rid"], result.requests["status"], strict=True))
    assert status["huge"] == "rejected"
    assert router.outstanding == 0
    router.table.check()
    assert sum(s.aborted for s in router.stats()) == 1
    assert sum(s.finished for s in router.stats()) == len(trace.requests) - 1
    assert result.summary["router"]["outstanding"] == 0


def test_cluster_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    rc = main(["replay", str(MOONCAKE), "--limit", "60", "--rate-scale", "4", "--model",
               "qwen3-0.6b", "--replicas", "2", "--router", "cache_aware",
               "--router-cache-threshold", "0.3", "--timeline", "--no-progress",
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    requests = pd.read_csv(out / "requests.csv")
    assert set(requests["replica"]) == {0, 1}
    steps = pd.read_csv(out / "steps.csv")
    assert steps.columns[-1] == "replica" and set(steps["replica"]) == {0, 1}
    for _, g in steps.groupby("replica"):
        assert (g["step"].diff().dropna() == 1).all()
    assert pd.read_csv(out / "queues.csv").columns[-1] == "replica"
    summary = json.loads((out / "summary.json").read_text())
    assert [r["replica"] for r in summary["replicas"]] == [0, 1]
    assert sum(r["requests"] for r in summary["replicas"]) == 60
    assert summary["router"]["policy"] == "cache_aware"
    assert sum(summary["router"]["decisions"].values()) == 60
    assert summary["config"]["router_cache_threshold"] == 0.3
    assert summary["router"]["warning"] is None  # the trace has hash_ids
    # the terminal shows the router's decisions and a row per replica, as summary.json has them
    printed = capsys.readouterr()
    assert "warning" not in printed.err
    lines = printed.out.splitlines()
    decisions = next(line for line in lines if line.startswith("decisions    "))
    for reason, n in summary["router"]["decisions"].items():
        assert f"{reason} {n} (" in decisions
    assert "router       cache_aware (load: requests)" in lines
    header = next(
        i for i, line in enumerate(lines) if line.split()[:3] == ["replica", "requests", "done"]
    )
    for r, line in zip(summary["replicas"], lines[header + 1 : header + 3], strict=True):
        cells = line.split()
        assert cells[:3] == [str(r["replica"]), str(r["requests"]), str(r["completed"])]
        assert cells[3] == f"{r['prefix_hit_rate']:.1%}"
        assert cells[7] == f"{r['ttft_ms']['p99']:,.1f}"
        assert cells[9] == f"{r['tpot_ms']['p99']:,.1f}"
    assert "Replicas" in (out / "report.html").read_text()
    events = json.loads((out / "timeline.json").read_text())["traceEvents"]
    engines = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {"engine (replica 0)", "engine (replica 1)"} <= engines
    assert {e["pid"] for e in events if e.get("cat") == "step"} == {2, 3}


def test_bad_cluster_flags_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["replay", str(MOONCAKE), "--limit", "5", "--no-progress", "--out", str(tmp_path)]
    assert main([*base, "--replicas", "0"]) == 2
    assert "replicas must be a positive integer, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([*base, "--router", "nope"])
    assert exc.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    config = tmp_path / "c.toml"
    config.write_text('replicas = 2\nrouter = "nope"\n')
    assert main([*base, "--config", str(config)]) == 2
    assert "unknown router policy 'nope'" in capsys.readouterr().err
    assert main([*base, "--replicas", "2", "--router-balance-rel-threshold", "0.5"]) == 2
    assert "balance_rel_threshold must be >= 1" in capsys.readouterr().err


def test_cache_aware_on_a_trace_without_hash_ids_says_it_routes_by_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An Azure trace has no prompt block hashes: cache_aware has nothing to match, routes
    every request to the least loaded replica, and the replay says so once, at the start."""
    azure = ROOT / "traces" / "azure_conv.csv"
    base = ["replay", str(azure), "--limit", "40", "--replicas", "2", "--no-progress"]
    rc = main([*base, "--router", "cache_aware", "--no-report", "--out", str(tmp_path / "a")])
    assert rc == 0
    printed = capsys.readouterr()
    warnings = [line for line in printed.err.splitlines() if "warning" in line]
    assert len(warnings) == 1
    assert f"{azure} has no hash_ids" in warnings[0] and "least loaded replica" in warnings[0]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["router"]["decisions"] == {"least_loaded": 40}
    assert "has no hash_ids" in summary["router"]["warning"]
    assert "decisions    least_loaded 40 (100%)" in printed.out
    # round robin reads no prefix: nothing to warn about
    base = ["replay", str(azure), "--limit", "40", "--replicas", "2", "--no-progress"]
    rc = main([*base, "--router", "round_robin", "--no-report", "--out", str(tmp_path / "r")])
    assert rc == 0 and "warning" not in capsys.readouterr().err
