"""``engine bench``'s outputs: request rows, steps rebuilt from token times, the timeline."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from lab.bench.client import RequestRecord
from lab.bench.frames import BENCH_COLUMNS, itl_seconds, request_frame, step_frame
from schema.metrics import REQUEST_COLUMNS, SERVER_TOKEN_COLUMNS
from schema.perfetto import write_timeline
from schema.steplog import STEP_COLUMNS
from schema.traces import load_trace
from sim.config import build_config
from sim.replay import run_replay

ROOT = Path(__file__).resolve().parents[1]
EPOCH0 = 1000.0


def record(
    rid: str, sent: float, scheduled: float, tokens: list[float], prompt: int = 10
) -> RequestRecord:
    """A completed request whose chunks reach the client 5 ms after the server stamps them."""
    r = RequestRecord(rid, sent, prompt, len(tokens), sent=sent, status="completed")
    r.chunk_times = [t + 0.005 for t in tokens]
    r.finished = r.chunk_times[-1] + 0.001
    r.usage = {"prompt_tokens": prompt, "completion_tokens": len(tokens),
               "prompt_tokens_details": {"cached_tokens": 2}}  # fmt: skip
    r.meta = {
        "received": EPOCH0 + sent + 0.01,
        "tokenized": EPOCH0 + sent + 0.02,
        "first_scheduled": EPOCH0 + scheduled,
        "token_times": [EPOCH0 + t for t in tokens],
        "prompt_tokens": prompt,
        "cached_tokens": 2,
    }
    return r


def records() -> list[RequestRecord]:
    return [
        record("a", 0.0, 0.03, [0.10, 0.20, 0.30]),
        record("b", 0.15, 0.20, [0.30, 0.40], prompt=30),
        record("c", 5.0, 5.05, [5.20]),
    ]


def test_request_rows_are_client_times_with_server_stages() -> None:
    frame = request_frame(records(), EPOCH0)
    assert list(frame.columns) == [*REQUEST_COLUMNS, *BENCH_COLUMNS, *SERVER_TOKEN_COLUMNS]
    a = frame.iloc[0]
    assert a["ttft_ms"] == pytest.approx(105.0)
    assert a["e2e_ms"] == pytest.approx(306.0)
    assert a["tpot_ms"] == pytest.approx((306.0 - 105.0) / 2)
    assert a["frontend_ms"] == pytest.approx(10.0) and a["tokenize_ms"] == pytest.approx(10.0)
    assert a["scheduler_wait_ms"] == pytest.approx(10.0)
    assert a["prefill_ms"] == pytest.approx(75.0)
    assert np.isnan(a["tokenizer_queue_ms"]) and np.isnan(frame.iloc[2]["tpot_ms"])
    assert (a["server_first_token"], a["server_last_token"]) == pytest.approx((0.10, 0.30))
    np.testing.assert_allclose(itl_seconds(records()), [0.1, 0.1, 0.1])


def test_steps_are_rebuilt_from_token_times() -> None:
    steps = step_frame(records(), EPOCH0)
    assert list(steps.columns) == list(STEP_COLUMNS)
    np.testing.assert_allclose(steps["time"], [0.03, 0.10, 0.20, 0.30, 5.05])
    np.testing.assert_allclose(steps["duration_s"], [0.07, 0.10, 0.10, 0.10, 0.15])
    assert steps["batch_size"].tolist() == [1, 1, 2, 1, 1]
    assert steps["decode_requests"].tolist() == [0, 1, 1, 1, 0]
    assert steps["prefill_tokens"].tolist() == [8, 0, 28, 0, 8]
    assert steps["num_running"].tolist() == [1, 1, 2, 1, 1]
    assert step_frame([RequestRecord("x", 0.0, 5, 5)], EPOCH0).empty


def test_a_refused_request_keeps_its_reason() -> None:
    refused = RequestRecord("r", 0.0, 9000, 10, sent=0.0, status="rejected", reason="HTTP 400")
    refused.finished = 0.01
    frame = request_frame([*records(), refused], EPOCH0)
    row = frame.iloc[-1]
    assert row["status"] == "rejected" and row["reason"] == "HTTP 400"
    assert np.isnan(row["ttft_ms"]) and row["output_tokens"] == 0


def _check_timeline(path: Path, source: str) -> dict[str, int]:
    doc = json.loads(path.read_text())
    assert doc["metadata"]["source"] == source
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    lanes: dict[int, list[tuple[float, float, str]]] = {}
    for e in slices:
        if e["pid"] == 1:
            lanes.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["args"]["rid"]))
    for spans in lanes.values():  # a lane holds one request at a time
        spans.sort()
        for (_, end, rid), (start, _, other) in itertools.pairwise(spans):
            assert rid == other or start >= end - 1e-3
    return {
        "requests": len({rid for spans in lanes.values() for *_, rid in spans}),
        "steps": sum(e["args"]["steps"] for e in slices if e["pid"] == 2),
    }


def test_timelines_share_one_schema(tmp_path: Path) -> None:
    trace = load_trace(ROOT / "traces" / "azure_conv.csv", limit=200)
    sim = run_replay(trace, build_config(), progress=False)
    write_timeline(tmp_path / "sim.json", sim.requests, sim.steps, "sim replay")
    counts = _check_timeline(tmp_path / "sim.json", "sim replay")
    assert counts == {"requests": 200, "steps": len(sim.steps)}
    real = records()
    write_timeline(tmp_path / "real.json", request_frame(real, EPOCH0),
                   step_frame(real, EPOCH0), "engine bench")  # fmt: skip
    assert _check_timeline(tmp_path / "real.json", "engine bench") == {"requests": 3, "steps": 5}


def test_unreachable_servers_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lab.bench.main import bench_main
    from lab.cli.sim import main as sim_main

    trace = str(ROOT / "traces" / "azure_conv.csv")
    url = "http://127.0.0.1:9"  # the discard port: nothing answers HTTP there
    assert bench_main([trace, "--url", url, "--out", str(tmp_path / "b")]) == 2
    assert "cannot list the models of http://127.0.0.1:9" in capsys.readouterr().err
    args = ["validate", trace, "--url", url, "--profile", "p.csv", "--out", str(tmp_path / "v")]
    assert sim_main(args) == 2
    assert "cannot list the models" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "v").exists()
