"""``sim replay`` writes its tables as the run goes: the files are those of the replay before
the tables streamed (pinned), and the same for any chunking (``--flush-steps``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from lab.cli.sim import main
from schema.traces import load_trace
from sim.config import build_config
from sim.replay import ReplayTables, run_replay

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = str(ROOT / "traces" / "mooncake_conversation.jsonl")
PINS = json.loads((ROOT / "tests" / "data" / "replay_pins.json").read_text())
"""sha256 of the tables and the summary's figures of ``sim replay`` on the first 300 requests
of the Mooncake trace (strict and overlapped), written before the tables streamed
(``requests.csv`` re-pinned when it gained the server token columns, its other columns
checked equal to the earlier file's; the overlapped run re-pinned when the table fit bounded
the features' coefficients at zero, which moved its figures by at most 0.14 %; both re-pinned
when the prefill fit gained its term in the rows sampled beside the decodes, which this
profile's four-chunk prefills tell apart: output throughput -1.6 to -1.8 %, latencies +1.8
to +2.8 %), priced by ``PINNED_PROFILE``."""
PINNED_PROFILE = ROOT / "reports/validate_h200/h200_llama-3.1-8b_before_split.csv"
"""The committed H200 profile when the pins were made (the default cost model then)."""
EXACT_SUMS = {("itl_ms", "mean"), ("replicas", "busy_share")}
"""Now exact sums (``schema.exactsum``): equal to the pinned float sums to 1e-14."""
TABLES = ("requests.csv", "steps.csv", "queues.csv")


def _replay(out: Path, *args: str) -> dict:
    assert main(["replay", MOONCAKE, "--limit", "300", "--no-progress", "--no-report",
                 "--out", str(out), *args]) == 0  # fmt: skip
    summary: dict = json.loads((out / "summary.json").read_text())
    return summary


def _close(pinned: object, got: object, path: tuple[str, ...] = ()) -> None:
    """``got`` equals ``pinned`` (floats of ``EXACT_SUMS`` to 1e-14 relative); keys added to the
    summary since (a replica's P99 and TPOT) are not pinned."""
    if isinstance(pinned, dict):
        assert isinstance(got, dict) and pinned.keys() <= got.keys(), path
        for k in pinned:
            _close(pinned[k], got[k], (*path, k))
    elif isinstance(pinned, list):
        assert isinstance(got, list) and len(pinned) == len(got), path
        for a, b in zip(pinned, got, strict=True):
            _close(a, b, path)
    elif (path[0], path[-1]) in EXACT_SUMS:
        assert got == pytest.approx(pinned, rel=1e-14), path
    else:
        assert got == pinned, path


@pytest.mark.parametrize("mode", ["strict", "overlap"])
def test_replay_outputs_equal_those_pinned_before_streaming(tmp_path: Path, mode: str) -> None:
    overlap = "--overlap" if mode == "overlap" else "--no-overlap"
    # the pins are of the frontend's intake and streaming in two queues, the model then, and
    # the KV pool of 0.9 of the GPU's memory (the simulator's default then)
    summary = _replay(tmp_path, overlap, "--profile", str(PINNED_PROFILE), "--no-frontend-loop",
                      "--mem-fraction", "0.9")  # fmt: skip
    pins = PINS[mode]
    for name in TABLES:
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == pins["files"][name]
    _close(pins["summary"], {k: summary[k] for k in pins["summary"]})


def _without_wall(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "wall_s"}


@pytest.mark.parametrize("steps", ["csv", "parquet"])
def test_tables_flushed_in_chunks_equal_one_flush(tmp_path: Path, steps: str) -> None:
    chunked = _replay(tmp_path / "chunked", "--overlap", "--steps", steps, "--flush-steps", "7")
    once = _replay(tmp_path / "once", "--overlap", "--steps", steps, "--flush-steps", "1000000")
    assert _without_wall(chunked) == _without_wall(once)
    for name in (f"steps.{steps}", "requests.csv", "queues.csv"):
        if name.endswith(".parquet"):
            a, b = (pd.read_parquet(tmp_path / d / name) for d in ("chunked", "once"))
            pd.testing.assert_frame_equal(a, b)
            assert a["blocked"].dtype == "category"
        else:
            assert (tmp_path / "chunked" / name).read_bytes() == (
                tmp_path / "once" / name
            ).read_bytes()


@pytest.mark.parametrize("replicas", [1, 2])
def test_frames_in_memory_are_the_same_for_any_chunking(replicas: int) -> None:
    trace = load_trace(MOONCAKE, limit=120, rate_scale=2.0)
    config = build_config(None, replicas=replicas, router="least_outstanding")
    small = run_replay(trace, config, progress=False, tables=ReplayTables(flush_steps=3))
    large = run_replay(trace, config, progress=False, tables=ReplayTables(flush_steps=10**6))
    pd.testing.assert_frame_equal(small.requests, large.requests)
    pd.testing.assert_frame_equal(small.steps, large.steps)
    pd.testing.assert_frame_equal(small.queues, large.queues)
    assert _without_wall(small.summary) == _without_wall(large.summary)


def test_a_bad_flush_size_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", MOONCAKE, "--limit", "5", "--no-progress", "--no-report",
                 "--flush-steps", "0", "--out", str(tmp_path)]) == 2  # fmt: skip
    assert "flush_steps must be >= 1" in capsys.readouterr().err
