"""The frontend's one event loop streaming every token beside the intake (``frontend_loop``:
sim.model.frontend)."""

from __future__ import annotations

import gc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from lab.cli.sim import main
from schema.traces import Trace, load_trace
from sim.config import build_config
from sim.costs.base import CpuCosts
from sim.model.frontend import FrontQueue
from sim.replay import build_costs, run_replay

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "traces" / "mooncake_conversation.jsonl"


def cpu_costs(**values: float) -> CpuCosts:
    config = build_config(None, model="qwen3-0.6b")
    return replace(build_costs(config)[1], **values)


def test_an_intake_waits_for_the_chunks_that_reached_the_loop_before_it() -> None:
    """Steps leaving at 0 and 1 ms with 10 chunks of 1 ms each reach the loop 2 hops later
    and hold it until 20 ms: a request at 5 ms is parsed at 21 ms; a run cut after its first
    step streams no more, and without the loop nothing waits."""
    cpu = cpu_costs(frontend=0.001, stream=0.001, ipc=0.0, detokenize=0.0)
    front = FrontQueue(cpu, 1, loop=True)
    assert front.stream(np.array([0.0, 0.001]), 10) is not None
    assert front.enter(0.005, 10)[0] == pytest.approx(0.021)
    cut = front.stream(np.array([0.030, 0.031, 0.032]), 10)
    assert cut is not None
    cut.cut(1)
    assert front.enter(0.045, 10)[0] == pytest.approx(0.046)  # 30-40 ms streamed, then free
    plain = FrontQueue(cpu, 1)
    assert plain.stream(np.array([0.0]), 10) is None
    assert plain.enter(0.005, 10)[0] == pytest.approx(0.006)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_loop_that_streams_for_free_changes_nothing(overlap: bool) -> None:
    """With no cost a chunk, the loop's intake is the plain frontend's: the same times as the
    single pipeline's, though the server runs as a cluster of one."""
    trace = load_trace(MOONCAKE, limit=80, rate_scale=3.0)
    config = build_config(None, model="qwen3-0.6b", overlap=overlap, frontend_loop=False)
    gpu, cpu = build_costs(config)
    free = (gpu, replace(cpu, stream=0.0))
    plain = run_replay(trace, config, progress=False, costs=free).requests
    looped = run_replay(trace, replace(config, frontend_loop=True), progress=False, costs=free)
    assert looped.router is not None  # ran as a cluster of one
    for col in ("frontend_ms", "tokenized", "first_token", "finished"):
        np.testing.assert_allclose(looped.requests[col], plain[col], rtol=0, atol=1e-9)


def test_streaming_delays_the_intake_of_requests_that_arrive_during_it() -> None:
    """A busy server: with the loop, a request's intake (its wait for the loop and its parse)
    is never shorter than without it, and longer for those that arrive while it streams."""
    trace = Trace("busy", "jsonl", load_trace(MOONCAKE, limit=120, rate_scale=6.0).requests)
    config = build_config(None, model="qwen3-0.6b", overlap=True, frontend_loop=False)
    gpu, cpu = build_costs(config)
    costs = (gpu, replace(cpu, stream=2e-4))
    plain = run_replay(trace, config, progress=False, costs=costs).requests
    looped = run_replay(trace, replace(config, frontend_loop=True), progress=False, costs=costs)
    added = looped.requests["frontend_ms"].to_numpy() - plain["frontend_ms"].to_numpy()
    assert added.min() >= -1e-6 and (added > 0.1).sum() >= 5


@pytest.mark.parametrize(("flag", "value"), [([], "false"), (["--frontend-loop"], "true")])
def test_the_flag_reaches_the_config(tmp_path: Path, flag: list[str], value: str) -> None:
    """Off by default (two queues: as faithful at a chunk's true cost, and faster);
    ``--frontend-loop`` turns it on."""
    out = tmp_path / "out"
    args = ["replay", str(MOONCAKE), "--limit", "20", "--model", "qwen3-0.6b", *flag,
            "--out", str(out), "--no-report", "--no-progress"]  # fmt: skip
    frozen = gc.get_freeze_count()
    assert main(args) == 0
    assert f'"frontend_loop": {value}' in (out / "summary.json").read_text()
    assert gc.get_freeze_count() == frozen  # the collector as it was, in this process
