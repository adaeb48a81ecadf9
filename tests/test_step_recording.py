"""The engine's step record: written by scheduler rank 0, read back as written, one row per step
that ran, and carried into ``engine bench``'s outputs on the run's clock."""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import Server, running_server

from core.scheduler import DecodeSlot, Plan, PrefillChunk, SchedulerConfig, StepShape
from engine.ipc.messages import TokenizedRequest
from engine.runner import ModelRunner, RunnerArgs
from engine.sampling import SamplingParams
from engine.scheduler_proc.driver import Launched, StepDriver
from engine.scheduler_proc.pd import TransferCounters
from engine.scheduler_proc.recorder import Launch, StepRecorder
from lab.bench.client import RequestRecord
from lab.bench.main import bench_main, server_steps_paths
from lab.bench.server import ServerInfo
from lab.bench.server_steps import run_steps
from schema.steprecord import (
    FLOAT_COLUMNS,
    SHAPE_COLUMNS,
    STEP_RECORD_COLUMNS,
    STEP_RECORD_NAME,
    TRANSFER_COLUMNS,
    read_step_record,
    replica_record_path,
)
from schema.tables import write_csv

EPOCH0 = 1_790_000_000.0
PLANS = [
    Plan(
        1, prefill=(PrefillChunk("a", 0, 30, True, (0, 1)), PrefillChunk("b", 16, 8, False, (2,)))
    ),
    Plan(3, decode=(DecodeSlot("a", 30, (0, 1)), DecodeSlot("c", 7, (3,)))),
]


def record_plans(path: Path, device_ms: list[float | None]) -> list[Launch]:
    """The rows of ``PLANS`` written through a recorder that flushes every row."""
    recorder = StepRecorder(path, flush_every=1)
    launches = []
    for i, (plan, ms) in enumerate(zip(PLANS, device_ms, strict=True)):
        t = EPOCH0 + i + 0.123456789
        launch = Launch.of(plan, (t, t + 1e-4, t + 1.5e-4, t + 2e-4), i > 0, (5 - i, i))
        recorder.add(launch, t + 3e-3, ms)
        launches.append(launch)
    recorder.close()
    return launches


def test_rows_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "steps.csv"
    launches = record_plans(path, [None, 1.25])
    steps = read_step_record(path)
    assert tuple(steps.columns) == STEP_RECORD_COLUMNS
    for column in STEP_RECORD_COLUMNS:
        assert steps[column].dtype == (np.float64 if column in FLOAT_COLUMNS else np.int64)
    for row, launch in zip(steps.itertuples(index=False), launches, strict=True):
        assert (row.step, row.schedule_start, row.enqueued, row.launched) == (
            launch.step, launch.schedule_start, launch.enqueued, launch.launched,
        )  # fmt: skip
        assert row.done == launch.schedule_start + 3e-3  # times survive exactly
        assert (row.in_flight, row.num_waiting, row.num_running) == (
            int(launch.in_flight), launch.num_waiting, launch.num_running,
        )  # fmt: skip
        assert row.prefill_requests == launch.prefill_requests
        shape = StepShape.of_plan(PLANS[launches.index(launch)])
        assert tuple(getattr(row, c) for c in SHAPE_COLUMNS) == tuple(
            getattr(shape, c) for c in SHAPE_COLUMNS
        )
    assert math.isnan(steps["device_ms"][0]) and steps["device_ms"][1] == 1.25
    # the bench writes it again through Arrow (quoted header): the same frame comes back
    write_csv(steps, tmp_path / "again.csv")
    pd.testing.assert_frame_equal(read_step_record(tmp_path / "again.csv"), steps)
    steps.to_csv(tmp_path / "again.csv.gz", index=False)  # as the reports keep records
    pd.testing.assert_frame_equal(read_step_record(tmp_path / "again.csv.gz"), steps)


def test_a_prefill_or_decode_server_records_the_transfers_that_ended(tmp_path: Path) -> None:
    """Each row: the ok transfers since the row before, from the hand-offs' running counters
    (none until they are set), whatever ended otherwise."""
    path = tmp_path / "steps.csv"
    recorder = StepRecorder(path, flush_every=1, transfers=True)
    counters = TransferCounters(Counter(ok=2, timeout=1), nbytes=3000, seconds=0.25)
    for i, plan in enumerate([*PLANS, Plan(5, decode=(DecodeSlot("a", 31, (0, 1)),))]):
        if i == 1:
            recorder.transfer_counters = counters
        if i == 2:
            counters.ended["timeout"] += 3
        launch = Launch.of(plan, (EPOCH0 + i,) * 4, False, (0, 1))
        recorder.add(launch, EPOCH0 + i + 0.5, None)
    recorder.close()
    steps = read_step_record(path)
    assert tuple(steps.columns) == (*STEP_RECORD_COLUMNS, *TRANSFER_COLUMNS)
    assert steps["kv_transfers"].tolist() == [0, 2, 0]
    assert steps["kv_bytes"].tolist() == [0, 3000, 0]
    assert steps["kv_transfer_ms"].tolist() == [0.0, 250.0, 0.0]
    assert steps["kv_transfer_ms"].dtype == np.float64


def test_a_record_from_before_enqueued_reads_with_it_empty(tmp_path: Path) -> None:
    path = tmp_path / "steps.csv"
    record_plans(path, [None, 1.25])
    new = read_step_record(path)
    old = new.drop(columns="enqueued")
    write_csv(old, tmp_path / "old.csv")
    again = read_step_record(tmp_path / "old.csv")
    assert list(again.columns) == list(STEP_RECORD_COLUMNS) and again["enqueued"].isna().all()
    pd.testing.assert_frame_equal(again.drop(columns="enqueued"), old)


def test_a_file_that_is_not_a_step_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("step,time\n1,2.0\n")
    with pytest.raises(ValueError, match="not a step record"):
        read_step_record(path)
    record_plans(path, [None, None])
    path.write_text(path.read_text().replace("\n1,", "\n1.5,", 1))
    with pytest.raises(ValueError, match="a cell is not a number"):
        read_step_record(path)


def test_the_bench_keeps_the_run_steps_on_its_clock(tmp_path: Path) -> None:
    path = tmp_path / "steps.csv"
    record_plans(path, [None, 2.0])  # steps scheduled at EPOCH0 + 0.12 and EPOCH0 + 1.12
    last = RequestRecord("r", 0.0, 1, 1, meta={"token_times": [EPOCH0 + 1.12]})
    steps = run_steps([path], [last], EPOCH0 + 0.5, wall_s=1.0, wait_s=0.0)
    assert steps["step"].tolist() == [3]
    assert steps["schedule_start"][0] == pytest.approx(0.623456789)
    assert steps["done"][0] == pytest.approx(0.626456789)


def test_replicas_records_become_one_table_with_a_replica_column(tmp_path: Path) -> None:
    named = tmp_path / "engine_steps.csv"
    assert replica_record_path(named, 0, 1) == named
    paths = [replica_record_path(named, k, 2) for k in range(2)]
    assert [p.name for p in paths] == ["engine_steps.replica0.csv", "engine_steps.replica1.csv"]
    record_plans(paths[0], [None, 2.0])
    record_plans(paths[1], [1.0, None])
    last = RequestRecord("r", 0.0, 1, 1, meta={"token_times": [EPOCH0 + 1.12]})
    steps = run_steps(paths, [last], EPOCH0, wall_s=2.0, wait_s=0.0)
    assert steps["replica"].tolist() == [0, 0, 1, 1] and steps["step"].tolist() == [1, 3, 1, 3]
    assert list(steps.columns) == [*STEP_RECORD_COLUMNS, "replica"]
    write_csv(steps, tmp_path / "run.csv")  # as the bench writes it: read back in (replica, step)
    again = read_step_record(tmp_path / "run.csv")
    pd.testing.assert_frame_equal(again, steps, check_dtype=False)
    assert again["replica"].dtype == np.int64
    shuffled = tmp_path / "shuffled.csv"
    write_csv(steps.iloc[::-1], shuffled)
    pd.testing.assert_frame_equal(read_step_record(shuffled), again)
    (tmp_path / "bad.csv").write_text(",".join([*STEP_RECORD_COLUMNS, "shard"]) + "\n")
    with pytest.raises(ValueError, match="'replica' with several replicas"):
        read_step_record(tmp_path / "bad.csv")


def test_bench_names_a_server_that_records_nothing(tmp_path: Path) -> None:
    info = ServerInfo("http://x", "m", "engine", None, None, None, False)
    with pytest.raises(ValueError, match="records no steps"):
        server_steps_paths("", info)
    assert server_steps_paths(None, info) is None
    named = tmp_path / "steps.csv"
    two = replace(info, record_steps=str(named), dp=2)
    record_plans(replica_record_path(named, 0, 2), [None, None])
    with pytest.raises(ValueError, match=r"no step record at .*steps\.replica1\.csv"):
        server_steps_paths("", two)
    record_plans(replica_record_path(named, 1, 2), [None, None])
    assert server_steps_paths("", two) == [replica_record_path(named, k, 2) for k in range(2)]


# ---------------------------------------------------------------- live server
PREFIX = "Every request of this test starts with the same long sentence, shared in the cache. " * 2
OUTPUT_TOKENS = 8


@pytest.fixture(scope="module", params=["--no-overlap", "--overlap"])
def recording(
    request: pytest.FixtureRequest, model_ready: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Path, bool]]:
    path = tmp_path_factory.mktemp("record") / "engine_steps.csv"
    args = ("--num-pages", "256", "--drain-timeout", "0", "--record-steps", str(path))
    with running_server(*args, request.param, cpu_threads=2) as server:
        yield server, path, request.param == "--overlap"


def complete(server: Server, prompt: str, max_tokens: int = OUTPUT_TOKENS) -> dict[str, Any]:
    body = {"model": "smollm2-135m", "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "return_meta_info": True}  # fmt: skip
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    reply.raise_for_status()
    meta: dict[str, Any] = reply.json()["meta_info"]
    return meta


def steps_until(path: Path, since: float, last_token: float) -> pd.DataFrame:
    """The steps scheduled after ``since``, once the file reaches ``last_token`` (the server
    writes them when it falls idle)."""
    deadline = time.monotonic() + 10
    while True:
        steps = read_step_record(path)
        steps = steps[steps["schedule_start"] >= since]
        if (not steps.empty and steps["done"].max() >= last_token) or time.monotonic() > deadline:
            return steps


@pytest.mark.slow
def test_one_row_per_step_of_concurrent_requests(recording: tuple[Server, Path, bool]) -> None:
    server, path, overlap = recording
    assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["record_steps"] == str(path)
    since = time.time()
    metas = [complete(server, PREFIX + "First.")]  # alone, so that the others find the prefix
    threads = [
        threading.Thread(target=lambda i=i: metas.append(complete(server, PREFIX + f"No. {i}.")))
        for i in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    last_token = max(m["token_times"][-1] for m in metas)
    steps = steps_until(path, since, last_token)

    assert steps["step"].is_monotonic_increasing and steps["step"].is_unique
    order = ["schedule_start", "schedule_end", "enqueued", "launched", "done"]
    assert (np.diff(steps[order].to_numpy(), axis=1) >= 0).all()
    assert steps["done"].max() >= last_token
    assert sum(m["cached_tokens"] for m in metas) > 0
    uncached = sum(m["prompt_tokens"] - m["cached_tokens"] for m in metas)
    assert steps["prefill_tokens"].sum() == uncached
    # every first token comes from a prefill, the others from one decode slot each; with
    # overlap a request finished by a stop token would cost one extra (discarded) slot, but
    # these all end at max_tokens, which the core sees coming
    outputs = sum(m["completion_tokens"] for m in metas)
    assert outputs == len(metas) * OUTPUT_TOKENS
    assert steps["decode_requests"].sum() == outputs - len(metas)
    assert (steps["prefill_requests"] > 0).eq(steps["prefill_tokens"] > 0).all()
    assert (steps["prefill_tokens"] + steps["decode_requests"] > 0).all()  # only steps that ran
    assert steps["num_waiting"].iloc[0] == 1 and steps["num_running"].iloc[0] == 0
    assert steps["device_ms"].isna().all()  # CPU: nothing times the device
    assert bool(steps["in_flight"].any()) is overlap
    first_scheduled = [m["first_scheduled"] for m in metas]
    assert np.isin(first_scheduled, steps["schedule_end"]).all()


@pytest.mark.slow
def test_bench_writes_engine_steps_on_its_clock(
    recording: tuple[Server, Path, bool], tmp_path: Path
) -> None:
    server, _, _ = recording
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 100 * i, "input_length": 40, "output_length": 4} for i in range(3)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "bench"
    argv = [str(trace), "--url", server.url, "--no-report", "--no-progress", "--server-steps"]
    assert bench_main([*argv, "--out", str(out)]) == 0
    steps = read_step_record(out / STEP_RECORD_NAME)
    summary = json.loads((out / "summary.json").read_text())
    requests = pd.read_csv(out / "requests.csv")
    assert summary["bench"]["server_steps"]["steps"] == len(steps) > 0
    assert steps["schedule_start"].min() >= 0  # the warm-up's steps came before the run
    assert steps["schedule_start"].max() <= summary["wall_s"]
    assert np.isin(requests["first_scheduled"], steps["schedule_end"]).all()  # one clock
    uncached = (requests["input_tokens"] - requests["cached_tokens"]).sum()
    assert steps["prefill_tokens"].sum() == uncached
    assert steps["decode_requests"].sum() == (requests["output_tokens"] - 1).sum()


def complete_cut_short(server: Server) -> None:
    with suppress(httpx.HTTPError):  # the server stops in the middle of it
        complete(server, "Count:", max_tokens=400)


@pytest.mark.slow
def test_sigterm_writes_the_steps_still_kept(recording: tuple[Server, Path, bool]) -> None:
    """Stopped mid-request (never idle since), the server writes its kept rows at exit."""
    server, path, _ = recording
    before = len(read_step_record(path))
    since = time.time()
    thread = threading.Thread(target=complete_cut_short, args=(server,))
    thread.start()
    deadline = time.monotonic() + 30
    while (
        server.metrics().get("engine_num_requests_running", 0) < 1 and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    time.sleep(0.5)
    assert len(read_step_record(path)) == before  # nothing flushed mid-request
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(30)
    thread.join()
    steps = read_step_record(path)
    assert len(steps) > before and (steps["schedule_start"].iloc[before:] >= since).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_times_each_step_on_the_device(tmp_path: Path) -> None:
    """CUDA events time each step's device work (CUDA graphs included), read with its tokens."""
    core = SchedulerConfig(num_pages=256, max_running=8)
    runner = ModelRunner(
        RunnerArgs(model="qwen3-0.6b", dummy_weights=True, device="cuda", scheduler=core)
    )
    runner.time_steps = True
    recorder = StepRecorder(tmp_path / "steps.csv")
    config = SchedulerConfig(num_pages=runner.num_pages, page_size=runner.page_size)
    driver = StepDriver(config, runner.launch, [], recorder)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_new_tokens=16)
    for i in range(4):
        driver.add(TokenizedRequest(f"r{i}", list(range(1 + i, 300 + i)), params, 0.0, 0.0))
    in_flight: Launched | None = None
    while driver.has_work() or in_flight is not None:
        _, in_flight, _ = driver.advance(in_flight, overlap=True)
    recorder.close()
    runner.close()
    steps = read_step_record(tmp_path / "steps.csv")
    assert steps["decode_requests"].sum() == 4 * 15
    assert (steps["device_ms"] > 0).all()
    assert (steps["device_ms"] / 1e3 <= steps["done"] - steps["enqueued"]).all()
    assert (steps["schedule_end"] <= steps["enqueued"]).all()
    assert (steps["enqueued"] <= steps["launched"]).all()
    assert steps["in_flight"].iloc[1:].all()  # overlap: each launched before the last finished
