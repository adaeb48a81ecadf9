"""Error attribution: recorded steps and stages replayed, the error split into its parts."""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.scheduler.shape import StepShape
from lab.cli.sim import main as sim_main
from lab.outputs import write_outputs, write_step_record
from lab.validate.attribution import METRICS, PARTS, decompose
from lab.validate.attribution_report import attribution_section
from lab.validate.step_errors import format_step_errors, step_errors
from schema.run import RunResult
from schema.steprecord import STEP_RECORD_COLUMNS, STEP_RECORD_NAME
from schema.traces import load_trace
from sim.config import SimConfig, build_config
from sim.costs.base import GpuCostModel
from sim.costs.committed import profile_dtype
from sim.costs.recorded import RecordedCostModel, recorded_times
from sim.replay import build_costs, run_replay

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "azure_conv.csv"
PROFILE = "profiles/h200_llama-3.1-8b.csv"
LIMIT, RATE_SCALE = 150, 10.0  # five seconds of traffic with a queue at the scheduler


class Scaled(GpuCostModel):
    """Every step ``factor`` times the wrapped model's (the planted step-time error)."""

    name = "scaled"
    profile = None
    provenance = "a test's planted error"

    def __init__(self, wrapped: GpuCostModel, factor: float) -> None:
        self.wrapped, self.factor = wrapped, factor

    def step_time(self, shape: StepShape) -> float:
        return self.wrapped.step_time(shape) * self.factor

    def device_time(self, shape: StepShape) -> float:
        return self.wrapped.device_time(shape) * self.factor

    def decode_times(self, batch: int, context_tokens: int, longest: int, k: int) -> np.ndarray:
        return self.wrapped.decode_times(batch, context_tokens, longest, k) * self.factor

    def decode_device_times(
        self, batch: int, context_tokens: int, longest: int, k: int
    ) -> np.ndarray:
        return self.wrapped.decode_device_times(batch, context_tokens, longest, k) * self.factor


def validation_config(overlap: bool) -> SimConfig:
    """The config ``sim validate --real-from`` rebuilds from a recorded run with ``PROFILE``."""
    return build_config(
        None, profile=PROFILE, cost_model="table", dtype=profile_dtype(PROFILE), overlap=overlap
    )


def validate_again(
    tmp_path: Path,
    overlap: bool,
    factor: float | None,
    record: bool,
    replicas: int = 1,
    gzipped: bool = False,
) -> tuple[Path, RunResult]:
    """A simulated run (its steps ``factor`` x the model's, if given; with its step record, if
    ``record``, gzipped if ``gzipped``) written as the real run of an earlier validation, then
    ``sim validate --real-from`` on it: its output folder, and the run."""
    trace = load_trace(TRACE, limit=LIMIT, rate_scale=RATE_SCALE)
    config = replace(validation_config(overlap), replicas=replicas)
    costs = None
    if factor is not None:
        gpu, cpu = build_costs(config)
        costs = (Scaled(gpu, factor), cpu)
    real = run_replay(trace, config, progress=False, record_steps=record, costs=costs)
    earlier = tmp_path / "earlier"
    write_outputs(real, earlier / "real-1", report=False)
    write_step_record(real.engine_steps, earlier / "real-1")
    assert (earlier / "real-1" / STEP_RECORD_NAME).is_file() == record
    if gzipped:
        plain = earlier / "real-1" / STEP_RECORD_NAME
        plain.with_name(f"{plain.name}.gz").write_bytes(gzip.compress(plain.read_bytes()))
        plain.unlink()
    run = {"trace": trace.describe(), "repeats": 1, "sim_config": config.to_dict()}
    (earlier / "comparison.json").write_text(json.dumps({"run": run}))
    out = tmp_path / "again"
    args = ["validate", str(TRACE), "--real-from", str(earlier), "--profile", PROFILE,
            "--out", str(out), "--no-report", "--no-progress"]  # fmt: skip
    assert sim_main(args) == 0
    assert (out / "sim" / STEP_RECORD_NAME).is_file()
    return out, real


def test_a_config_file_changes_the_recorded_config(tmp_path: Path) -> None:
    """``--real-from DIR --config FILE`` (or ``--cpu-profile``): the file's keys replace the
    recorded ones (here the CPU
    stage costs of another profile, whose tokenizer takes 3.4 us a token against the H200
    profile's 5.9: earlier first tokens)."""
    out, _ = validate_again(tmp_path, overlap=False, factor=None, record=False)
    before = json.loads((out / "comparison.json").read_text())
    other_cpu = "profiles/cpu-epyc-2core_smollm2-135m.csv"
    config = tmp_path / "cpu.json"
    config.write_text(json.dumps({"cpu_profile": other_cpu}))
    again = tmp_path / "again_cpu"
    args = ["validate", str(TRACE), "--real-from", str(tmp_path / "earlier"), "--profile",
            PROFILE, "--config", str(config), "--out", str(again), "--no-report",
            "--no-progress"]  # fmt: skip
    assert sim_main(args) == 0
    after = json.loads((again / "comparison.json").read_text())
    assert after["run"]["sim_config"]["cpu_profile"] == other_cpu
    assert before["run"]["sim_config"]["cpu_profile"] is None
    assert "--config" in after["run"]["command"]
    assert after["ttft_ms"]["p50"]["sim"] < before["ttft_ms"]["p50"]["sim"]
    flag = tmp_path / "again_flag"
    args = [*args[: args.index("--config")], "--cpu-profile", other_cpu, "--out", str(flag),
            "--no-report", "--no-progress"]  # fmt: skip
    assert sim_main(args) == 0
    by_flag = json.loads((flag / "comparison.json").read_text())
    assert by_flag["ttft_ms"]["p50"]["sim"] == after["ttft_ms"]["p50"]["sim"]
    assert "--cpu-profile" in by_flag["run"]["command"]


def attribute_simulated_run(
    tmp_path: Path, overlap: bool, factor: float | None, gzipped: bool = False
) -> dict:
    """``validate_again`` with the step record: the real run's attribution."""
    out, real = validate_again(tmp_path, overlap, factor, record=True, gzipped=gzipped)
    attribution = json.loads((out / "attribution.json").read_text())
    assert json.loads((out / "comparison.json").read_text())["attribution"]["file"]
    section = attribution_section(attribution)  # the report's section reads the same file
    assert "real-1" in section.body and "step-time model (C - B)" in section.body
    result: dict = attribution["runs"]["real-1"]
    result["wait_p90_ms"] = float(real.requests["scheduler_wait_ms"].quantile(0.9))
    return result


@pytest.mark.parametrize("overlap", [False, True])
def test_the_step_record_of_fast_forwarded_runs_is_that_of_single_steps(overlap: bool) -> None:
    trace = load_trace(TRACE, limit=60, rate_scale=RATE_SCALE)
    config = validation_config(overlap)
    fast = run_replay(trace, config, progress=False, record_steps=True)
    slow = run_replay(trace, replace(config, fast_forward=False), progress=False, record_steps=True)
    assert fast.summary["fast_forward"]["steps_in_runs"] > len(fast.engine_steps) / 2
    assert list(fast.engine_steps.columns) == list(STEP_RECORD_COLUMNS)
    pd.testing.assert_frame_equal(fast.engine_steps, slow.engine_steps, rtol=1e-12)
    e = fast.engine_steps
    assert (e["schedule_start"] <= e["schedule_end"]).all()
    assert (e["schedule_end"] <= e["launched"]).all() and (e["launched"] <= e["done"]).all()
    assert (e["step"].to_numpy() == fast.steps["step"].to_numpy()).all()
    assert e["device_ms"].notna().all() == overlap and e["in_flight"].any() == overlap


def test_runs_without_a_step_record_are_said_to_have_none(tmp_path: Path) -> None:
    out, _ = validate_again(tmp_path, overlap=False, factor=None, record=False)
    assert not (out / "attribution.json").exists()
    note = json.loads((out / "comparison.json").read_text())["attribution"]["note"]
    assert note.startswith("no error attribution: real-1 hold(s) no engine_steps.csv")


def test_the_parts_add_up_to_the_total() -> None:
    for real, c, b, a in [(10.0, 13.0, 11.5, 9.0), (0.3, 0.1, 0.7, 0.2), (1e3, 1e3, 1e3, 1e3)]:
        e = decompose(real, c, b, a)
        parts = sum(e["parts"][p]["abs"] for p in PARTS)
        assert parts == pytest.approx(e["total"]["abs"], abs=1e-12)
        assert sum(e["parts"][p]["rel"] for p in PARTS) == pytest.approx(e["total"]["rel"])
    assert decompose(None, 1.0, 1.0, 1.0)["total"] is None
    assert decompose(0.0, 1.0, 1.0, 1.0)["total"]["rel"] is None


@pytest.mark.parametrize("overlap", [False, True])
def test_a_simulated_run_against_itself_attributes_nothing(tmp_path: Path, overlap: bool) -> None:
    run = attribute_simulated_run(tmp_path, overlap, None)
    assert run["plans"]["A"]["unmatched"] == 0
    assert run["plans"]["A"]["matched"] == run["plans"]["recorded_steps"] > 100
    assert run["stages"]["intake_recorded"] == run["stages"]["output_recorded"] == LIMIT
    for key in METRICS:
        e = run["metrics"][key]
        assert abs(e["total"]["abs"]) <= 1e-9 * e["real"], key
        for p in PARTS:
            assert abs(e["parts"][p]["abs"]) <= 1e-9 * e["real"], (key, p)
    assert abs(run["steps"]["all"]["step"]["error"]) < 1e-9


def test_a_planted_step_time_error_lands_in_the_step_time_part(tmp_path: Path) -> None:
    run = attribute_simulated_run(tmp_path, False, 1.2)
    assert run["wait_p90_ms"] > 100  # requests queue at the scheduler (tens of steps)
    assert run["steps"]["all"]["step"]["error"] == pytest.approx(1 / 1.2 - 1)
    for key in METRICS:
        e = run["metrics"][key]
        total = e["total"]["abs"]
        assert abs(e["total"]["rel"]) > 0.03, key  # the simulation misses the slower run
        assert e["parts"]["step_time_model"]["abs"] == pytest.approx(total, rel=0.02), key
        for p in ("cpu_stages", "scheduling_divergence"):
            assert abs(e["parts"][p]["abs"]) <= 0.02 * abs(total), (key, p)


def test_a_gzipped_step_record_attributes_as_the_plain_one(tmp_path: Path) -> None:
    plain = attribute_simulated_run(tmp_path / "plain", False, 1.2)
    gzipped = attribute_simulated_run(tmp_path / "gzipped", False, 1.2, gzipped=True)
    assert gzipped["plans"]["recorded_steps"] > 100
    assert gzipped == plain


def test_a_simulated_cluster_against_itself_prices_each_replica_s_steps_exactly(
    tmp_path: Path,
) -> None:
    """Several replicas: no split into parts, the cost model on each replica's plans."""
    out, real = validate_again(tmp_path, overlap=True, factor=1.25, record=True, replicas=2)
    assert set(real.engine_steps["replica"]) == {0, 1}
    attribution = json.loads((out / "attribution.json").read_text())
    assert attribution["note"].startswith("2 replicas: the cost model on each replica's")
    run = attribution["runs"]["real-1"]
    assert run["recorded_steps"] == len(real.engine_steps) and "metrics" not in run
    assert set(run["replicas"]) == {"0", "1"}
    for k, steps in run["replicas"].items():
        mine = real.engine_steps[real.engine_steps["replica"] == int(k)]
        assert steps["all"]["step"]["n"] == len(mine) > 20
        assert steps["all"]["step"]["error"] == pytest.approx(1 / 1.25 - 1)  # the planted 25 %
        assert steps["all"]["device"]["error"] == pytest.approx(1 / 1.25 - 1)
    section = attribution_section(attribution)
    assert "real-1, replica 1" in section.body and "C - B" not in section.body


class Linear(GpuCostModel):
    """1 ms plus 1 us per token of the step; device time half of it."""

    name = "linear"
    profile = None
    provenance = "test"

    def step_time(self, shape: StepShape) -> float:
        return 1e-3 + 1e-6 * (shape.prefill_tokens + shape.decode_requests)

    def device_time(self, shape: StepShape) -> float:
        return self.step_time(shape) / 2

    def decode_times(self, batch: int, context_tokens: int, longest: int, k: int) -> np.ndarray:
        return np.array([self.step_time(StepShape.decode(batch, 0, 0))] * k)


def record_of(rows: list[tuple[StepShape, float, float, float | None]]) -> pd.DataFrame:
    """A step record: per row a shape, its strict step time, host time and device ms."""
    out = []
    for i, (shape, strict, host, device_ms) in enumerate(rows):
        start = float(i)
        row = {"step": i, "schedule_start": start, "schedule_end": start + 1e-4,
               "enqueued": start + 1e-4 + host, "launched": start + 1e-4 + host,
               "done": start + 1e-4 + strict,
               "device_ms": np.nan if device_ms is None else device_ms, "in_flight": 0,
               "num_waiting": 0, "num_running": shape.decode_requests,
               "prefill_requests": int(shape.prefill_tokens > 0)}  # fmt: skip
        row |= {f: getattr(shape, f) for f in STEP_RECORD_COLUMNS[-7:]}
        out.append(row)
    return pd.DataFrame(out, columns=list(STEP_RECORD_COLUMNS))


DECODE_4 = StepShape.decode(4, 400, 100)
DECODE_5 = StepShape.decode(5, 500, 100)
PREFILL = StepShape(256, 0, 256, 0, 0, 256 * 257 // 2, 1)
MIXED = StepShape(100, 3, 400, 300, 300, 5050, 4)


def test_recorded_steps_price_their_shapes_in_order() -> None:
    record = record_of([(DECODE_4, 0.010, 0.002, 6.0), (DECODE_4, 0.020, 0.003, 7.0),
                        (PREFILL, 0.050, 0.004, None)])  # fmt: skip
    strict = RecordedCostModel(record, Linear(), overlap=False)
    assert strict.step_time(DECODE_4) == pytest.approx(0.010)
    assert strict.times(DECODE_4) == pytest.approx((0.020, 0.007))
    assert strict.times(PREFILL) == pytest.approx((0.050, 0.050 - 0.004))  # no device time
    assert (strict.matched, strict.unmatched) == (3, 0)
    strict.step_time(DECODE_4)  # both recorded DECODE_4 steps are used up
    assert (strict.matched, strict.unmatched) == (3, 1)
    overlap = RecordedCostModel(record, Linear(), overlap=True)
    assert overlap.times(DECODE_4) == pytest.approx((0.002 + 0.006, 0.006))
    assert overlap.device_time(DECODE_4) == pytest.approx(0.007)


def test_unmatched_steps_get_the_model_corrected_by_similar_recorded_steps() -> None:
    model = Linear()
    record = record_of([(DECODE_4, 2 * model.step_time(DECODE_4), 0.0, None),
                        (PREFILL, 3 * model.step_time(PREFILL), 0.0, None)])  # fmt: skip
    priced = RecordedCostModel(record, model, overlap=False)
    # the same kind and band of step tokens (4 and 5 decodes: 2-7): that band's ratio
    assert priced.step_time(DECODE_5) == pytest.approx(2 * model.step_time(DECODE_5))
    # no recorded step in its band: its kind's ratio
    assert priced.step_time(StepShape.decode(64, 6400, 100)) == pytest.approx(
        2 * model.step_time(StepShape.decode(64, 6400, 100))
    )
    # no recorded step of its kind: the ratio over all recorded steps (the median of 2 and 3)
    assert priced.step_time(MIXED) == pytest.approx(2.5 * model.step_time(MIXED))
    assert priced.unmatched == 3 and priced.matched == 0
    empty = RecordedCostModel(record.iloc[:0], model, overlap=False)
    assert empty.step_time(MIXED) == pytest.approx(model.step_time(MIXED))
    with pytest.raises(RuntimeError, match="fast_forward"):
        priced.decode_times(4, 400, 100, 3)


@pytest.mark.slow
def test_a_live_validation_attributes_the_recorded_runs(model_ready: str, tmp_path: Path) -> None:
    """``sim validate --url`` against a server that records its steps: the bench runs carry the
    record, and each metric's error splits into parts that add up."""
    from conftest import running_server

    from schema.traces import generate

    trace = tmp_path / "short.jsonl"
    generate(trace, arrival="poisson", rate=2.0, input_spec="uniform:16:96",
             output_spec="uniform:2:6", num=6, seed=5)  # fmt: skip
    out = tmp_path / "validate"
    record = ("--num-pages", "256", "--record-steps", str(tmp_path / "steps.csv"))
    with running_server(*record, cpu_threads=2) as server:
        argv = ["validate", str(trace), "--url", server.url, "--profile",
                str(ROOT / "profiles" / "cpu-xeon-2core_smollm2-135m.csv"), "--repeats", "1",
                "--out", str(out), "--no-progress", "--no-report"]  # fmt: skip
        assert sim_main(argv) == 0
    assert (out / "real-1" / STEP_RECORD_NAME).is_file()
    attribution = json.loads((out / "attribution.json").read_text())
    run = attribution["runs"]["real-1"]
    assert run["plans"]["recorded_steps"] > 0
    for key in METRICS:
        e = run["metrics"][key]
        if e["total"] is None:
            continue
        parts = sum(e["parts"][p]["abs"] for p in PARTS)
        assert parts == pytest.approx(e["total"]["abs"], rel=1e-9, abs=1e-9), key


def test_an_eager_launch_that_the_device_overlapped_is_not_host_time_twice() -> None:
    """A graph replay is launched before its device work; an eager forward mostly after it:
    the overlapped loop's host time ends where the host began handing the step over."""
    record = record_of([(PREFILL, 0.0, 0.0, None), (MIXED, 0.0, 0.0, None)])
    record["schedule_end"] = [0.0, 0.0]
    record["enqueued"] = [0.0015, 0.003]
    record["launched"] = [0.002, 0.018]  # the second: 15 ms of eager launch
    record["done"] = [0.010, 0.031]  # the second's done waited for the next step's launch
    record["device_ms"] = [5.0, 12.0]
    step, device = recorded_times(record, overlap=True)
    assert device == pytest.approx([0.005, 0.012])
    assert step - device == pytest.approx([0.0015, 0.003])  # host: to enqueued
    strict, _ = recorded_times(record, overlap=False)
    assert strict == pytest.approx([0.010, 0.031])  # the strict loop's step is the wall
    # a record from before ``enqueued``: to launched, or to done - device if earlier
    record["enqueued"] = np.nan
    step, device = recorded_times(record, overlap=True)
    assert step - device == pytest.approx([0.002, 0.018])  # the second runs long


def test_steps_past_the_profile_s_grid_are_told_apart() -> None:
    """Decode steps recorded 10 % slower than the model past the profile's longest row, and
    as fast inside it: the reach groups put the whole error on the steps beyond."""
    gpu, cpu = build_costs(validation_config(True))
    measured = gpu.measured_reach()
    assert measured is not None
    longest = 2 * measured.decode_longest
    plans = [
        (StepShape.decode(4, 4 * 1024, 1024), 1.0),
        (StepShape.decode(4, 4 * longest, longest), 1.1),
    ]
    rows, t = [], 0.0
    for i, (shape, slower) in enumerate(plans * 3):
        device = gpu.device_time(shape) * slower
        rows.append(asdict(shape) | {
            "step": i, "schedule_start": t, "schedule_end": t, "enqueued": t, "launched": t,
            "done": t + device, "device_ms": device * 1e3, "in_flight": 0, "num_waiting": 0,
            "num_running": shape.decode_requests, "prefill_requests": 0,
        })  # fmt: skip
        t += device
    record = pd.DataFrame(rows)[list(STEP_RECORD_COLUMNS)]
    errors = step_errors(RecordedCostModel(record, gpu, True), record, cpu)
    reach = errors["by_reach"]
    assert list(reach) == ["within", "beyond", "beyond, decode 2-7"]
    assert reach["within"]["device"]["n"] == reach["beyond"]["device"]["n"] == 3
    assert reach["within"]["device"]["error"] == pytest.approx(0, abs=1e-9)
    assert reach["beyond"]["device"]["error"] == pytest.approx(1 / 1.1 - 1)
    assert reach["beyond, decode 2-7"] == reach["beyond"]
    assert any(
        line.strip().startswith("reach beyond, decode 2-7") for line in format_step_errors(errors)
    )
