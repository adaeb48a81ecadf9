"""Replicas sharing a GPU in the simulator (sim.costs.colocation, sim.model.shared_gpu), and the
replicas of ``engine serve --dp N`` sharing one frontend (``shared_frontend``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.scheduler.shape import StepShape
from lab.cli.sim import main as sim_main
from schema.traces import Trace
from schema.traces.record import TraceRequest
from sim.config import build_config
from sim.costs.colocation import Colocation, check_colocation, fit_colocation, read_colocation
from sim.model.shared_gpu import MIN_SHARE, SharedGpu
from sim.replay import build_costs, run_replay

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "reports" / "cluster" / "h200" / "h200_qwen3-0.6b.csv"
TIMES = ("first_token", "finished", "ttft_ms", "e2e_ms")
PAIRS = [("decode", "decode"), ("decode", "prefill"), ("prefill", "decode"), ("prefill", "prefill")]


def table(path: Path, *stretch: float) -> Path:
    """A co-location table: decode beside decode, decode beside prefill, prefill beside decode,
    prefill beside prefill."""
    rows = [(k, o, v) for (k, o), v in zip(PAIRS, stretch, strict=True)]
    path.write_text("kind,other,stretch,steps\n" + "".join(f"{k},{o},{v},0\n" for k, o, v in rows))
    return path


def replay(trace: Trace, colocation: Path | None, record: bool = False, **settings: object):  # type: ignore[no-untyped-def]
    values: dict[str, object] = {"model": "qwen3-0.6b", "profile": str(PROFILE), "overlap": True,
                                 "replicas": 2, "router": "round_robin"}  # fmt: skip
    values |= settings
    if colocation is not None:
        values["colocation"] = str(colocation)
    config = build_config(None, **values)  # type: ignore[arg-type]
    return run_replay(trace, config, progress=False, record_steps=record)


def busy_trace(n: int = 60, seed: int = 3) -> Trace:
    rng = np.random.default_rng(seed)
    t, requests = 0.0, []
    for i in range(n):
        t += float(rng.exponential(0.1))
        requests.append(
            TraceRequest(f"r{i}", t, int(rng.integers(200, 3000)), int(rng.integers(20, 200)))
        )
    return Trace("busy", "jsonl", requests)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_table_of_ones_changes_nothing(tmp_path: Path, overlap: bool) -> None:
    ones = table(tmp_path / "ones.csv", 1, 1, 1, 1)
    alone = replay(busy_trace(), None, overlap=overlap).requests
    shared = replay(busy_trace(), ones, overlap=overlap).requests
    for col in TIMES:
        np.testing.assert_allclose(shared[col], alone[col], rtol=0, atol=1e-9)


def test_a_replica_with_the_gpu_to_itself_is_not_stretched(tmp_path: Path) -> None:
    """Requests far apart: one replica runs at a time, so no step has another beside it."""
    apart = Trace("apart", "jsonl", [TraceRequest(f"r{i}", 5.0 * i, 1500, 40) for i in range(6)])
    stretched = table(tmp_path / "t.csv", 1.5, 2.0, 1.3, 2.0)
    alone = replay(apart, None).requests
    shared = replay(apart, stretched).requests
    for col in TIMES:
        np.testing.assert_allclose(shared[col], alone[col], rtol=0, atol=1e-9)


def test_two_decoding_replicas_stretch_each_other_and_the_fit_reads_it_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two long decodes side by side, one on each replica: every decode step runs beside the
    other's, so each is stretched by decode-beside-decode, which a fit of the step record
    recovers (as a ratio: the steps are all of about one size); the inter-token time grows
    by the same factor."""
    # a third, short request (to the first replica, round robin) prefills beside the second's
    # decodes, so that every pair of kinds runs and the fitted table is whole
    both = Trace("both", "jsonl", [TraceRequest("a", 0.0, 64, 600), TraceRequest("b", 0.0, 64, 600),
                                   TraceRequest("c", 0.5, 64, 2)])  # fmt: skip
    stretched = table(tmp_path / "t.csv", 1.5, 2.0, 1.3, 2.0)
    alone = replay(both, None)
    shared = replay(both, stretched, record=True)
    ratio = shared.requests["tpot_ms"].to_numpy() / alone.requests["tpot_ms"].to_numpy()
    assert ratio[:2] == pytest.approx([1.5, 1.5], rel=0.03)
    assert shared.engine_steps is not None
    record = tmp_path / "steps.csv"
    shared.engine_steps.to_csv(record, index=False)
    out = tmp_path / "fit.csv"
    fit = ["colocation", "fit", str(record), "--profile", str(PROFILE), "--model", "qwen3-0.6b"]
    assert sim_main([*fit, "--out", str(out)]) == 0
    fitted = pd.read_csv(out).set_index(["kind", "other"])
    assert fitted.loc[("decode", "decode"), "stretch"] == pytest.approx(1.5, rel=0.02)
    assert fitted.loc[("decode", "decode"), "fixed_ms"] == 0  # steps of one size: a ratio
    # --check prices the same steps with a table: the fitted one matches them, ones do not
    ones = table(tmp_path / "ones.csv", 1.0, 1.0, 1.0, 1.0)
    for checked, error in ((out, 0.0), (ones, 1 / 1.5 - 1)):
        capsys.readouterr()
        assert sim_main([*fit, "--check", str(checked)]) == 0
        printed = capsys.readouterr().out
        row = next(
            line.split() for line in printed.splitlines() if line.startswith("decode   decode")
        )
        assert float(row[-1].rstrip("%")) / 100 == pytest.approx(error, abs=0.02)


def test_the_later_step_of_a_pair_settles_the_earlier_one(tmp_path: Path) -> None:
    """Stretching only the step launched second would leave the first one short: a replica that
    decodes alone, then has the other's prefill start beside it, gets a third of the GPU for
    as long as the prefill runs (decode beside prefill stretched 3x), so it ends later than
    with the GPU to itself by about two thirds of the prefill."""
    trace = Trace(
        "pair", "jsonl", [TraceRequest("a", 0.0, 64, 400), TraceRequest("b", 0.3, 6000, 2)]
    )
    stretched = table(tmp_path / "t.csv", 1.0, 3.0, 1.0, 1.0)  # only decode beside prefill
    alone = replay(trace, None).requests.set_index("rid")
    shared = replay(trace, stretched).requests.set_index("rid")
    prefill_s = alone.loc["b", "first_token"] - alone.loc["b", "tokenized"]
    delay = shared.loc["a", "finished"] - alone.loc["a", "finished"]
    assert delay == pytest.approx(prefill_s * 2 / 3, rel=0.25)
    assert shared.loc["b", "first_token"] == pytest.approx(alone.loc["b", "first_token"], abs=1e-9)


def gpu_of(*stretch: float) -> SharedGpu:
    """Two replicas on a GPU with the table ``stretch`` (the order of ``table``)."""
    colocation = Colocation(dict(zip(PAIRS, stretch, strict=True)), {}, "test")
    return SharedGpu(colocation, 2)


def test_a_step_is_stretched_only_while_the_step_beside_it_runs() -> None:
    """Replica 0 runs a prefill chunk over [0, 1), then a decode step; a decode step of replica 1
    launched at 0.5 does a sixth of its work beside the chunk (a third of the GPU), the rest
    beside the decode at full speed: 0.5 + 5/6, not three times its time."""
    gpu = gpu_of(1.0, 3.0, 1.0, 1.0)
    first, second = gpu.seat(0), gpu.seat(1)
    assert first.price("prefill", 0.0, 1.0) == 1.0  # alone
    assert first.price("decode", 1.0, 2.0) == 2.0  # beside nothing yet
    assert second.price("decode", 0.5, 1.0) == pytest.approx(0.5 + 5 / 6)
    assert gpu.debt == [0.0, 0.0]  # decode beside decode is 1: nothing to settle


def test_a_busy_replica_goes_on_and_an_idle_one_gives_back() -> None:
    """Past a replica's last known step the others are priced as if it went on with steps of
    that kind; when it goes idle instead, what they were charged past then comes back as a
    credit: the work done at a third of the GPU, done at all of it."""
    gpu = gpu_of(1.0, 3.0, 1.0, 1.0)
    first, second = gpu.seat(0), gpu.seat(1)
    first.price("prefill", 0.0, 1.0)
    assert second.price("decode", 0.5, 1.0) == pytest.approx(3.0)  # beside the chunk throughout
    first.rest(1.0)
    assert gpu.debt[1] == pytest.approx(-2.5 * (1 - 1 / 3))  # 2.5 s at 3x: 5/6 of work
    assert gpu.idle == [True, False]
    assert second.price("decode", 3.5, 1.0) == pytest.approx(max(1.0 - 5 / 3, MIN_SHARE))


def test_a_debt_is_the_work_done_in_the_overlap_at_the_new_stretch() -> None:
    """Replica 1 priced a decode step beside replica 0's decode steps (1.5x); replica 0 launches
    a prefill chunk over it instead (3x): the overlap's work takes twice as long, and replica 1
    pays the difference first on its next step, which is not stretched again for it."""
    gpu = gpu_of(1.5, 3.0, 1.0, 1.0)
    first, second = gpu.seat(0), gpu.seat(1)
    first.price("decode", 0.0, 1.0)
    assert second.price("decode", 0.0, 1.0) == pytest.approx(1.5)  # beside decodes throughout
    first.price("prefill", 1.0, 1.0)  # over [1.0, 1.5) of replica 1's step
    assert gpu.debt[1] == pytest.approx(0.5 * (3.0 / 1.5 - 1))
    first.rest(2.0)
    assert second.price("decode", 2.5, 1.0) == pytest.approx(0.5 + 1.0)
    first.price("prefill", 2.6, 1.0)  # over its debt, then its work: only the work is settled
    assert gpu.debt[1] == pytest.approx((3.6 - 3.0) * (3.0 - 1.0))  # not [2.6, 3.0)


def test_one_frontend_serves_the_replicas_of_one_server() -> None:
    """engine serve --dp N tokenizes every replica's requests in one pool: two prompts arriving
    together on two replicas are tokenized one after the other; N servers tokenize at once."""
    together = Trace(
        "t", "jsonl", [TraceRequest("a", 0.0, 4000, 4), TraceRequest("b", 0.0, 4000, 4)]
    )
    own = replay(together, None).requests.set_index("rid")
    one = replay(together, None, shared_frontend=True).requests.set_index("rid")
    assert own.loc["b", "tokenize_start"] < own.loc["a", "tokenized"]
    assert one.loc["b", "tokenize_start"] == pytest.approx(one.loc["a", "tokenized"])
    assert set(one["replica"]) == {0, 1}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("kind,other,stretch\n", "starts with the header"),
        ("kind,other,stretch,steps\ndecode,decode,x,1\n", "must be numbers"),
        ("kind,other,stretch,fixed_ms,steps\ndecode,decode,1.2,y,1\n", "must be numbers"),
        ("kind,other,stretch,steps\ndecode,gpu,1.2,1\n", "OTHER in"),
        ("kind,other,stretch,steps\ndecode,decode,0,1\n", "must be > 0"),
        ("kind,other,stretch,steps\ndecode,decode,1.2,1\n", "no stretch for"),
    ],
)
def test_a_bad_table_is_a_clear_error(tmp_path: Path, text: str, error: str) -> None:
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(ValueError, match=error):
        read_colocation(tmp_path / "bad.csv")
    with pytest.raises(ValueError, match=error):
        replay(busy_trace(4), tmp_path / "bad.csv")


def test_a_table_round_trips(tmp_path: Path) -> None:
    path = table(tmp_path / "t.csv", 1.25, 2.5, 1.3, 1.9)
    read = read_colocation(path)
    again = tmp_path / "again.csv"
    read.write(again)
    assert read_colocation(again).stretch == read.stretch
    assert read.of("decode", ["prefill"], 0.01) == 2.5 and read.of("prefill", [], 0.01) == 1.0
    assert read.of("decode", ["decode", "prefill"], 0.01) == pytest.approx(1 + 0.25 + 1.5)


def test_a_fixed_time_weighs_on_short_steps_and_round_trips(tmp_path: Path) -> None:
    """decode beside prefill at 1.5 * w + 4 ms: a 2 ms step takes 7 ms (3.5x), a 20 ms one
    34 ms (1.7x); a negative fixed time never makes a step faster than alone."""
    path = tmp_path / "t.csv"
    path.write_text("kind,other,stretch,fixed_ms,steps\n"
                    "decode,decode,1.2,0,9\ndecode,prefill,1.5,4,9\n"
                    "prefill,decode,1.4,-8,9\nprefill,prefill,2,0,9\n")  # fmt: skip
    read = read_colocation(path)
    assert read.of("decode", ["prefill"], 0.002) == pytest.approx(3.5)
    assert read.of("decode", ["prefill"], 0.020) == pytest.approx(1.7)
    assert read.of("prefill", ["decode"], 0.010) == 1.0  # 1.4 - 0.8 = 0.6, held at 1
    assert read.of("prefill", ["decode"], 0.100) == pytest.approx(1.32)
    again = tmp_path / "again.csv"
    read.write(again)
    assert read_colocation(again).fixed == pytest.approx(read.fixed)
    gpu = SharedGpu(read, 2)
    first, second = gpu.seat(0), gpu.seat(1)
    first.price("prefill", 0.0, 1.0)
    assert second.price("decode", 0.0, 0.002) == pytest.approx(0.007)


def test_the_affine_fit_recovers_stretch_and_fixed_time_and_keeps_the_sums() -> None:
    """Replica 1's decode steps of growing batches each run wholly beside a long prefill chunk
    of replica 0, taking 1.6 * w + 3 ms: the affine fit reads back 1.6 and 3 ms, the ratio fit
    one factor that prices the group's summed time exactly and the smallest step low."""
    config = build_config(None, model="qwen3-0.6b", profile=str(PROFILE), overlap=True)
    gpu, _ = build_costs(config)
    shapes = [StepShape.decode(b, b * 4096, 4096) for b in range(1, 61)]
    alone = np.array([gpu.device_time(shape) for shape in shapes])
    device = 1.6 * alone + 0.003
    ends = np.cumsum(device + 1e-4)
    decode = step_rows(ends - device, device, shapes)
    chunk = StepShape(8192, 0, 8192, 0, 0, 8192 * 8193 // 2, 1)
    prefill = step_rows(np.array([0.0]), np.array([ends[-1] + 1.0]), [chunk])
    affine = fit_colocation([[prefill, decode]], gpu, "test")
    assert affine.stretch["decode", "prefill"] == pytest.approx(1.6, rel=1e-6)
    assert affine.fixed["decode", "prefill"] == pytest.approx(0.003, rel=1e-6)
    steps, recorded, priced = check_colocation(affine, [[prefill, decode]], gpu)[
        "decode", "prefill"
    ]
    assert (steps, recorded) == (60, pytest.approx(device.sum()))
    assert priced == pytest.approx(device.sum(), rel=1e-6)
    ratio = fit_colocation([[prefill, decode]], gpu, "test", form="ratio")
    assert ratio.fixed["decode", "prefill"] == 0.0
    factor = ratio.stretch["decode", "prefill"]
    assert factor * alone.sum() == pytest.approx(device.sum(), rel=1e-9)
    assert factor * alone[0] < 0.8 * device[0]
    with pytest.raises(ValueError, match="unknown co-location form"):
        fit_colocation([[prefill, decode]], gpu, "test", form="cubic")


def step_rows(starts: np.ndarray, device: np.ndarray, shapes: list[StepShape]) -> pd.DataFrame:
    """A step record of steps on the GPU over [start, start + device), launched as enqueued."""
    rows = []
    for i, (start, dev, shape) in enumerate(zip(starts, device, shapes, strict=True)):
        times = {"schedule_start": start, "schedule_end": start, "enqueued": start,
                 "launched": start, "done": start + dev}  # fmt: skip
        counts = {"in_flight": 0, "num_waiting": 0, "num_running": shape.decode_requests,
                  "prefill_requests": int(shape.prefill_tokens > 0)}  # fmt: skip
        rows.append({"step": i + 1, **times, "device_ms": dev * 1e3, **counts, **asdict(shape)})
    return pd.DataFrame(rows)


def test_validate_again_with_the_table_reproduces_a_shared_gpu_run(tmp_path: Path) -> None:
    """A simulated two-replica run on one GPU, written as the real run of an earlier
    validation: ``sim validate --real-from DIR --colocation TABLE`` simulates it again
    exactly; without the table (each replica with a GPU of its own) the TTFT comes out low."""
    from lab.outputs import write_outputs
    from schema.traces import load_trace

    trace_path = ROOT / "traces" / "mooncake_conversation.jsonl"
    trace = load_trace(trace_path, limit=80, rate_scale=4.0)
    stretched = table(tmp_path / "t.csv", 1.5, 2.5, 1.3, 2.0)
    config = build_config(None, model="qwen3-0.6b", profile=str(PROFILE), overlap=True,
                          replicas=2, router="round_robin", shared_frontend=True,
                          colocation=str(stretched))  # fmt: skip
    real = run_replay(trace, config, progress=False)
    earlier = tmp_path / "earlier"
    write_outputs(real, earlier / "real-1", report=False)
    recorded = config.to_dict() | {"colocation": None}  # as a server's card gives it
    run = {"trace": trace.describe(), "repeats": 1, "sim_config": recorded}
    (earlier / "comparison.json").write_text(json.dumps({"run": run}))
    ttft = {}
    for name, extra in (("with", ["--colocation", str(stretched)]), ("without", [])):
        out = tmp_path / name
        args = ["validate", str(trace_path), "--real-from", str(earlier), "--profile",
                str(PROFILE), "--out", str(out), "--no-report", "--no-progress"]  # fmt: skip
        args += extra
        assert sim_main(args) == 0
        ttft[name] = json.loads((out / "comparison.json").read_text())["ttft_ms"]["p90"]
    assert ttft["with"]["rel_err"] == pytest.approx(0.0, abs=1e-9)
    assert ttft["without"]["rel_err"] < -0.05


def test_the_size_of_the_chunk_beside_a_decode_step_counts_on_the_h200(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The 60x round robin run's decode steps beside prefill chunks: a fit with the chunks'
    size (time alone) beside each step halves the residual of one line per pair of kinds,
    and a larger chunk takes longer."""
    run = ROOT / "reports" / "cluster" / "h200" / "host_a" / "rr60"
    assert sim_main(["colocation", "share", str(run), "--profile", str(PROFILE)]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if "beside prefill" in line)
    fits = {line.split()[0]: line.split() for line in lines[start:] if "residual RMS" in line}
    assert float(fits["size"][-2]) < 0.6 * float(fits["line"][-2])
    assert float(fits["size"][6]) > 0.2  # ms per ms of the chunk's time alone


def test_cpu_replicas_read_back_from_step_records_without_device_time(tmp_path: Path) -> None:
    """CPU replicas share the host's cores: the strict loop stretches a step from the end of
    its ``schedule`` to ``done`` and records no device time. A fit of such records (one file
    with a ``replica`` column, as the simulator and ``engine bench`` write it) reads the
    stretch back from those intervals."""
    cpu_profile = ROOT / "profiles" / "cpu-xeon-2core_smollm2-135m.csv"
    both = Trace(
        "both", "jsonl", [TraceRequest("a", 0.0, 64, 200), TraceRequest("b", 0.0, 64, 200)]
    )
    stretched = table(tmp_path / "t.csv", 1.25, 2.0, 1.3, 2.0)
    shared = replay(both, stretched, record=True, overlap=False, model="smollm2-135m",
                    profile=str(cpu_profile))  # fmt: skip
    assert shared.engine_steps is not None
    assert shared.engine_steps["device_ms"].isna().all()
    record = tmp_path / "steps.csv"
    shared.engine_steps.to_csv(record, index=False)
    out = tmp_path / "fit.csv"
    command = ["colocation", "fit", str(record), "--profile", str(cpu_profile),
               "--model", "smollm2-135m", "--out", str(out)]  # fmt: skip
    assert sim_main(command) == 0
    fitted = pd.read_csv(out).set_index(["kind", "other"])
    assert fitted.loc[("decode", "decode"), "stretch"] == pytest.approx(1.25, rel=0.02)


def test_the_colocation_tools_refuse_missing_records_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step record or a run folder that is not there: one line naming it, exit 2."""
    none = tmp_path / "none.csv"
    fit = ["colocation", "fit", str(none), "--profile", str(PROFILE), "--out", str(tmp_path / "t")]
    assert sim_main(fit) == 2
    err = capsys.readouterr().err
    assert err == f"sim colocation fit: error: {none}: no such step record\n"
    assert sim_main(["colocation", "share", str(tmp_path), "--profile", str(PROFILE)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sim colocation share: error: ") and "holds no steps.replica0" in err
