"""``engine profile --plans-from``: plans rebuilt from a step record's shapes, and timed."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import MODEL
from hypothesis import given, settings
from hypothesis import strategies as st

from core.scheduler.shape import StepShape
from lab.cli.sim import main as sim_main
from lab.profile.grid import StepPoint
from lab.profile.main import profile_main
from lab.profile.recorded import (
    RecordedStep,
    chunk_attention,
    decode_reads,
    recorded_steps,
    spread,
)
from schema.steprecord import STEP_RECORD_COLUMNS, read_step_record

PAGE = 16
chunk = st.tuples(st.integers(0, 4096), st.integers(1, 2048))


def recorded(point: StepPoint, step: int = 0, device_ms: float = 1.0) -> RecordedStep:
    plan = point.plan(PAGE)
    return RecordedStep(step, 0, StepShape.of_plan(plan), len(plan.prefill), device_ms, 2.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20_000), min_size=1, max_size=64))
def test_decode_rows_keep_the_sum_and_the_longest(positions: list[int]) -> None:
    reads = [p + 1 for p in positions]
    rebuilt = decode_reads(len(reads), sum(reads), len(reads) * max(reads))
    assert len(rebuilt) == len(reads) and sum(rebuilt) == sum(reads)
    assert max(rebuilt) == max(reads) and min(rebuilt) >= 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(chunk, max_size=1),
    st.lists(st.integers(0, 8192), max_size=40),
)
def test_one_chunk_and_decode_rows_rebuild_exactly(
    chunks: list[tuple[int, int]], positions: list[int]
) -> None:
    if not chunks and not positions:
        return
    step = recorded(StepPoint(tuple(chunks), tuple(positions)))
    assert step.shape_matches(PAGE)


@settings(max_examples=100, deadline=None)
@given(st.lists(chunk, min_size=2, max_size=5), st.lists(st.integers(0, 8192), max_size=8))
def test_several_chunks_keep_every_field_but_their_pairs(
    chunks: list[tuple[int, int]], positions: list[int]
) -> None:
    """Chunks of unequal prefixes are rebuilt with the same tokens and prefix in all; their
    query-key pairs as near as one chunk's length and prefix can bring them."""
    step = recorded(StepPoint(tuple(chunks), tuple(positions)))
    point = step.point()
    assert len(point.prefill) == len(chunks)
    rebuilt = StepShape.of_plan(point.plan(PAGE))
    s = step.shape
    for field in ("prefill_tokens", "decode_requests", "context_tokens", "decode_context",
                  "decode_padded"):  # fmt: skip
        assert getattr(rebuilt, field) == getattr(s, field)
    k, cached = len(chunks), sum(start for start, _ in chunks)
    even = chunk_attention(list(zip(spread(cached, k), spread(s.prefill_tokens, k), strict=True)))
    missed = abs(rebuilt.prefill_attention - s.prefill_attention)
    assert missed <= abs(even - s.prefill_attention)


def test_a_record_of_two_chunks_rebuilds_their_pairs_exactly() -> None:
    """A chunk finishing its prompt after a long prefix beside a new prompt's first chunk: the
    common mixed step at the edge."""
    step = recorded(StepPoint(((4000, 300), (0, 1748)), (900, 2000, 3100)))
    assert step.shape_matches(PAGE)
    (s1, n1), (s2, n2) = step.point().prefill
    assert n1 + n2 == 2048 and s1 + s2 == 4000  # one pair of many with these pairs


def write_record(path: Path, steps: list[RecordedStep]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(STEP_RECORD_COLUMNS)
        for i, s in enumerate(steps):
            times = [i, i, i, i + s.launch_ms / 1e3, i + 0.5]
            shape = [getattr(s.shape, c) for c in StepShape.__slots__]
            w.writerow([s.step, *times, s.device_ms, 0, 0, 1, s.prefill_requests, *shape])


def test_steps_are_chosen_evenly_per_kind(tmp_path: Path) -> None:
    decodes = [recorded(StepPoint((), (10 * i,) * 2), i, 2.0) for i in range(10)]
    mixed = [recorded(StepPoint(((0, 32),), (64,)), 10 + i, 3.0) for i in range(3)]
    write_record(tmp_path / "r.csv", [*decodes, *mixed])
    chosen = recorded_steps(read_step_record(tmp_path / "r.csv"), 4)
    assert [s.step for s in chosen] == [10, 11, 12, 0, 2, 5, 7]
    assert chosen[0].kind == "mixed" and chosen[0].device_ms == 3.0
    assert chosen[0].launch_ms == pytest.approx(2.0)
    untimed = read_step_record(tmp_path / "r.csv").assign(device_ms=float("nan"))
    with pytest.raises(ValueError, match="no device times"):
        recorded_steps(untimed, 4)


@pytest.mark.slow
def test_engine_profile_times_a_record_s_plans(
    model_ready: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = [
        recorded(StepPoint(((0, 48),), ()), 3, 40.0),
        recorded(StepPoint(((32, 16), (0, 20)), (40, 90)), 7, 30.0),
        recorded(StepPoint((), (17, 60, 33)), 8, 20.0),
    ]
    write_record(tmp_path / "engine_steps.csv", steps)
    out = tmp_path / "alone.csv"
    argv = ["--model", MODEL, "--cpu-threads", "1", "--num-pages", "256", "--repeats", "1",
            "--no-cpu-stages", "--plans-from", str(tmp_path / "engine_steps.csv"),
            "--out", str(out)]  # fmt: skip
    assert profile_main(argv) == 0
    with (tmp_path / "alone_vs_record.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["step"]) for r in rows) == [3, 7, 8]
    by_step = {int(r["step"]): r for r in rows}
    assert by_step[7]["kind"] == "mixed" and by_step[7]["shape_exact"] == "1"
    assert float(by_step[3]["recorded_device_ms"]) == 40.0
    assert float(by_step[3]["recorded_launch_ms"]) == pytest.approx(2.0)
    assert all(float(r["alone_device_ms"]) > 0 for r in rows)
    assert all(0 < float(r["alone_launch_ms"]) < 5e3 for r in rows)
    printed = capsys.readouterr().out
    assert "run/alone" in printed and "mixed" in printed and "ms alone" in printed
    with pytest.raises(SystemExit) as exc:
        profile_main([*argv[:-3], "--plans-from", str(tmp_path / "none.csv"), "--out", str(out)])
    assert exc.value.code == 2
    assert "--plans-from" in capsys.readouterr().err


def test_record_vs_alone_splits_serving_from_the_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sim profile vs-record``: the run over the plans alone per kind, and each profile's
    model over the plans alone (here the plans alone took exactly what the model says)."""
    from sim.costs import TableCostModel, read_profile

    profile = "profiles/h200_llama-3.1-8b.csv"
    model = TableCostModel(read_profile(profile))
    steps = [
        recorded(StepPoint(((0, 512),), (1000,) * 8), 1),
        recorded(StepPoint((), (900,) * 4), 2),
    ]
    path = tmp_path / "p_vs_record.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", *StepShape.__slots__, "recorded_device_ms", "alone_device_ms"])
        for s, slower in zip(steps, (1.2, 0.9), strict=True):
            alone = model.device_time(s.shape) * 1e3
            w.writerow([s.kind, *(getattr(s.shape, c) for c in StepShape.__slots__),
                        alone * slower, alone])  # fmt: skip
    assert sim_main(["profile", "vs-record", str(path), "--profile", profile]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert lines["mixed"][2:] == ["1.200", "1.000"] and lines["decode"][2:] == ["0.900", "1.000"]
    other = tmp_path / "other.csv"
    other.write_text("kind,recorded_device_ms\ndecode,1.0\n")
    for bad, why in ((tmp_path / "none.csv", "no such file"), (other, "lacks the columns")):
        assert sim_main(["profile", "vs-record", str(bad), "--profile", profile]) == 2
        err = capsys.readouterr().err
        assert err.startswith("sim profile vs-record: error: ") and why in err
