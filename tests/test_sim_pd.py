"""The simulated disaggregated cluster (``sim.model.pd_cluster``): P prefill and D decode
replicas behind the PD router, the KV priced by ``sim.costs.transfer``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.cli.sim import main
from schema.traces import Trace
from schema.traces.record import TraceRequest
from sim.config import build_config
from sim.replay import ReplayResult, run_replay

ROOT = Path(__file__).resolve().parents[1]
LINK = {"transfer_latency_s": 0.002, "transfer_gbps": 10.0}
PD = {"model": "qwen3-0.6b", "prefill_replicas": 1, "decode_replicas": 1, **LINK}


def trace_of(*requests: tuple[float, int, int], hashes: bool = False) -> Trace:
    """Requests of (arrival, input length, output length), block hashes of their own."""
    reqs = [
        TraceRequest(
            f"r{i}", t, n, m, tuple(range(1000 * i, 1000 * i + -(-n // 512))) if hashes else ()
        )
        for i, (t, n, m) in enumerate(requests)
    ]
    return Trace("synthetic", "jsonl", reqs)


def replay(trace: Trace, **config: Any) -> ReplayResult:
    return run_replay(trace, build_config(None, **(PD | config)), progress=False)


def assert_clean(result: ReplayResult) -> None:
    """Every core holds nothing for a request at the end: no transfer, none running."""
    for sched in result.scheduler:
        assert not sched.held_for_transfer()
        assert not sched.running and not sched.num_waiting
        assert not sched.has_work()
    assert result.router is not None and result.router.outstanding == 0
    assert result.summary["disaggregation"]["prefill_router"]["outstanding"] == 0


def test_one_request_waits_for_its_transfer_between_its_first_and_second_token() -> None:
    """Its first token leaves as the decode side pairs it; its second after the KV landed:
    a slower link moves the second token and the end by the difference, not the first."""
    trace = trace_of((0.0, 2048, 8))
    fast = replay(trace)
    slow = replay(trace, transfer_latency_s=0.502)
    assert_clean(fast)
    a, b = fast.requests.iloc[0], slow.requests.iloc[0]
    assert a["status"] == b["status"] == "completed"
    assert a["first_token"] == pytest.approx(b["first_token"], abs=1e-9)
    assert b["finished"] - a["finished"] == pytest.approx(0.5, abs=1e-6)
    transfers = fast.summary["disaggregation"]["transfers"]
    assert transfers["count"] == 1 and transfers["tokens"] == 2048
    per_token = fast.summary["disaggregation"]["transfer_costs"]["per_token_s"]
    assert transfers["wire_seconds"] == pytest.approx(0.002 + 2048 * per_token)
    ipc = fast.summary["disaggregation"]["control_message_s"]
    assert transfers["seconds"] >= transfers["wire_seconds"] + ipc - 1e-12  # send to ack


def test_a_request_of_one_token_moves_no_kv() -> None:
    result = replay(trace_of((0.0, 600, 1), (0.01, 600, 4)))
    assert result.requests["status"].tolist() == ["completed", "completed"]
    assert result.requests["output_tokens"].tolist() == [1, 4]
    assert result.summary["disaggregation"]["transfers"]["count"] == 1
    assert_clean(result)


def test_pages_the_decode_prefix_cache_holds_are_not_sent() -> None:
    """The same 4-block prompt twice, apart: the second sends only its last partial page."""
    shared = tuple(range(4))
    reqs = [
        TraceRequest("a", 0.0, 4 * 512 + 8, 4, shared),
        TraceRequest("b", 5.0, 4 * 512 + 8, 4, shared),
    ]
    result = replay(Trace("synthetic", "jsonl", reqs))
    transfers = result.summary["disaggregation"]["transfers"]
    assert transfers["count"] == 2
    assert transfers["tokens"] == (4 * 512 + 8) + 8  # the second: past its 4 cached blocks
    assert_clean(result)


def test_a_request_too_long_fails_on_both_sides_and_the_rest_complete() -> None:
    trace = trace_of((0.0, 1024, 8), (0.01, 400 * 512, 8), (0.02, 1024, 8))
    result = replay(trace, num_pages=4096)
    assert result.requests["status"].tolist() == ["completed", "rejected", "completed"]
    assert_clean(result)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.tuples(st.floats(0, 2), st.integers(1, 3000), st.integers(1, 40)),
        min_size=1,
        max_size=12,
    ),
    p=st.integers(1, 2),
    d=st.integers(1, 2),
    overlap=st.booleans(),
    pages=st.sampled_from([96, 400, 4096]),
)
def test_any_trace_ends_with_every_request_settled_on_both_sides(
    requests: list[tuple[float, int, int]], p: int, d: int, overlap: bool, pages: int
) -> None:
    """Whatever the arrivals, lengths, replicas, loop and pool (small ones preempt and
    reject): the run ends, each request completes with all its tokens or is rejected, in
    order of its stages, and no core, router or transfer holds anything after."""
    trace = trace_of(*sorted(requests), hashes=True)
    result = replay(trace, prefill_replicas=p, decode_replicas=d, overlap=overlap,
                    num_pages=pages, page_size=16)  # fmt: skip
    req = result.requests
    done = req[req["status"] == "completed"]
    assert set(req["status"]) <= {"completed", "rejected"}
    expected = {r.rid: r.output_length for r in trace.requests}
    assert done["output_tokens"].tolist() == [expected[r] for r in done["rid"]]
    assert (done["first_token"] >= done["sched_arrival"]).all()
    assert (done["finished"] >= done["first_token"]).all()
    assert set(done["replica"]) <= set(range(p, p + d))  # the decode replicas stream
    moved = result.summary["disaggregation"]["transfers"]["count"]
    assert moved <= int((done["output_tokens"] > 1).sum())
    assert_clean(result)


def test_fast_forward_and_determinism() -> None:
    trace = trace_of(*[(0.05 * i, 300 + 97 * i, 30 + i) for i in range(20)])
    fast = replay(trace, decode_replicas=2)
    again = replay(trace, decode_replicas=2)
    slow = replay(trace, decode_replicas=2, fast_forward=False)
    assert fast.summary["fast_forward"]["steps_in_runs"] > 0
    for other in (again, slow):
        for col in ("first_token", "finished", "replica"):
            np.testing.assert_allclose(fast.requests[col], other.requests[col], atol=1e-9)


def test_the_step_record_carries_each_sides_transfers() -> None:
    """Each replica's rows carry the transfers as a prefill or decode server's do: all of
    them once, a prefill replica's timed from the send to the acknowledgment, a decode
    replica's at their price, their bytes whole pages; the same with and without fast
    forwarding. (A row counts what ended before it: the last request, of one token, moves
    no KV and gives the prefill replica a step after the last acknowledgment.)"""
    trace = trace_of(*[(0.05 * i, 300 + 97 * i, 30 + i) for i in range(12)], (30.0, 64, 1))
    records = []
    for fast_forward in (True, False):
        result = run_replay(
            trace,
            build_config(None, **(PD | {"decode_replicas": 2, "fast_forward": fast_forward})),
            progress=False,
            record_steps=True,
        )
        steps = result.engine_steps
        assert steps is not None
        assert list(steps.columns[-4:]) == ["kv_transfers", "kv_bytes", "kv_transfer_ms", "replica"]
        transfers = result.summary["disaggregation"]["transfers"]
        per_replica = steps.groupby("replica")[["kv_transfers", "kv_bytes", "kv_transfer_ms"]].sum()
        prefill, decode = per_replica.loc[0], per_replica.loc[1:].sum()
        assert prefill["kv_transfers"] == decode["kv_transfers"] == transfers["count"] == 12
        pages = sum(-(-(300 + 97 * i) // 16) for i in range(12))
        page_bytes = 16 * result.summary["disaggregation"]["transfer_costs"]["bytes_per_token"]
        nbytes = pytest.approx(pages * page_bytes, abs=12)
        assert prefill["kv_bytes"] == decode["kv_bytes"] == nbytes
        assert prefill["kv_transfer_ms"] == pytest.approx(transfers["seconds"] * 1e3)
        assert decode["kv_transfer_ms"] == pytest.approx(transfers["wire_seconds"] * 1e3)
        assert (steps["kv_transfer_ms"] >= 0).all() and steps["kv_transfers"].max() >= 1
        records.append(per_replica)
    pd.testing.assert_frame_equal(records[0], records[1], rtol=1e-6)


def test_sim_replay_flags_and_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 100 * i, "input_length": 700, "output_length": 6, "hash_ids": [i]}
            for i in range(6)]  # fmt: skip
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    code = main(["replay", str(trace), "--out", str(out), "--model", "qwen3-0.6b",
                 "--prefill-replicas", "1", "--decode-replicas", "2", "--transfer-latency-s",
                 "0.001", "--transfer-gbps", "20", "--no-report", "--no-progress"])  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    pd_ = summary["disaggregation"]
    assert pd_["enabled"] and pd_["prefill_replicas"] == 1 and pd_["decode_replicas"] == 2
    assert pd_["prefill_requests"] == [6] and pd_["transfers"]["count"] == 6
    assert [r["requests"] for r in summary["replicas"]] == [0, 3, 3]
    assert summary["config"]["prefill_replicas"] == 1


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"prefill_replicas": 1}, "needs prefill_replicas and decode_replicas"),
        ({"prefill_replicas": 1, "decode_replicas": 1, "replicas": 2}, "replace replicas"),
        ({"prefill_replicas": -1}, "prefill_replicas must be an integer >= 0"),
        ({"transfer_gbps": 0}, "transfer_gbps > 0"),
        (
            {
                "prefill_replicas": 1,
                "decode_replicas": 1,
                "speculative": "synthetic",
                "acceptance": "0.5",
            },
            "not served disaggregated",
        ),
    ],
)
def test_bad_disaggregation_settings_are_clear_errors(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_config(None, model="qwen3-0.6b", **values)


def test_without_a_price_for_the_transfer_the_replay_says_so() -> None:
    config = build_config(None, model="qwen3-0.6b", prefill_replicas=1, decode_replicas=1)
    with pytest.raises(ValueError, match="the KV transfer has no price"):
        run_replay(trace_of((0.0, 100, 4)), config, progress=False)
    assert replace(config, transfer_latency_s=0.0, transfer_gbps=1.0).disaggregated


def test_capacity_over_the_cluster_knob_compares_colocated_and_disaggregated(
    tmp_path: Path,
) -> None:
    """``cluster = ["2", "1:1", "1:0"]``: two colocated servers and a 1:1 split, each with its
    capacity per server; a split without decode servers fails as an invalid configuration."""
    grid, config, out = tmp_path / "grid.toml", tmp_path / "c.json", tmp_path / "out"
    grid.write_text('cluster = ["2", "1:1", "1:0"]\n')
    config.write_text(json.dumps({"model": "qwen3-0.6b", **LINK}))
    args = ["capacity", str(ROOT / "traces" / "azure_conv.csv"), "--grid", str(grid),
            "--config", str(config), "--limit", "60", "--slo-ttft-ms", "300",
            "--slo-tpot-ms", "30", "--tolerance", "0.2", "--jobs", "1", "--no-progress",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    cap = pd.read_csv(out / "capacity.csv").set_index("cluster")
    assert list(cap["status"]) == ["ok", "ok", "failed"]
    assert "cluster takes N (replicas) or P:D" in cap.loc["1:0", "error"]
    ok = cap.loc[["2", "1:1"]]
    assert (ok["servers"] == 2).all() and (ok["max_rate_scale"] > 0).all()
    per = ok["max_request_rate"] / 2
    np.testing.assert_allclose(ok["max_request_rate_per_server"], per)
