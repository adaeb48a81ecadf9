"""Cost models: the roofline's physics, the table fit, profile provenance and CPU costs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from core.scheduler import StepShape
from sim.config import build_config
from sim.costs import (
    DEFAULT_CPU_PROFILE,
    CostSpec,
    ProfileError,
    RooflineCostModel,
    TableCostModel,
    hardware,
    load_cpu_costs,
    make_cost_model,
    model_shape,
    read_profile,
)
from sim.costs.profile import COLUMNS, EMPTY_SHAPE, ProfileRow, write_profile
from sim.costs.roofline import KERNELS_PER_LAYER, KERNELS_PER_STEP
from sim.replay import build_costs

PROVENANCE = "# hardware: test cpu\n# model: test\n# date: 2026-11-29\n# command: pytest\n"
HEADER = ",".join(COLUMNS) + "\n"


def decode_shape(batch: int, context: int) -> StepShape:
    return StepShape.decode(batch, context, context // batch)


def test_llama_decode_is_memory_bound_at_small_batch() -> None:
    llama, h200 = model_shape("llama-3.1-8b"), hardware("h200")
    roof = RooflineCostModel(llama, h200)
    t = roof.step_time(decode_shape(1, 1000))
    weights = llama.weights_read_per_step * 2
    kv = 1001 * llama.kv_bytes_per_token(2)
    overhead = (KERNELS_PER_LAYER * llama.num_layers + KERNELS_PER_STEP) * h200.kernel_floor_s
    assert t == pytest.approx((weights + kv) / h200.mem_bandwidth + overhead, rel=1e-12)
    assert 3e-3 < t < 5e-3  # ~16 GB of weights at ~4.3 TB/s


def test_llama_large_prefill_is_compute_bound() -> None:
    roof = RooflineCostModel(model_shape("llama-3.1-8b"), hardware("h200"))
    n = 8192
    shape = StepShape(n, 0, n, 0, 0, n * (n + 1) // 2, 1)
    t = roof.step_time(shape)
    assert t > roof.step_time(StepShape(1, 0, 1, 0, 0, 1, 1)) * 10
    llama = model_shape("llama-3.1-8b")
    linear = 2 * llama.num_layers * llama.layer_params * n
    assert t > linear / 797e12  # at least the matmul FLOPs at peak


def test_decode_times_match_single_steps() -> None:
    for name in ("llama-3.1-8b", "qwen3-0.6b", "smollm2-135m"):
        roof = RooflineCostModel(model_shape(name), hardware("h200"))
        batch, context, k = 37, 20_000, 50
        run = roof.decode_times(batch, context, context // batch, k)
        single = [roof.step_time(decode_shape(batch, context + i * batch)) for i in range(k)]
        np.testing.assert_allclose(run, single, rtol=1e-12)


def test_tensor_parallel_splits_work_and_adds_all_reduce() -> None:
    llama, h200 = model_shape("llama-3.1-8b"), hardware("h200")
    one = RooflineCostModel(llama, h200, tp=1).step_time(decode_shape(8, 8000))
    two = RooflineCostModel(llama, h200, tp=2).step_time(decode_shape(8, 8000))
    assert one / 2 < two < one
    with pytest.raises(ValueError, match="must divide"):
        RooflineCostModel(llama, h200, tp=3)


def test_unknown_names_are_clear_errors() -> None:
    spec = CostSpec("llama-3.1-8b", "h200", 1, "bf16", "bf16")
    with pytest.raises(ValueError, match="unknown cost model 'magic'"):
        make_cost_model("magic", spec)
    with pytest.raises(ValueError, match="unknown model preset"):
        model_shape("gpt-5")
    with pytest.raises(ProfileError, match="needs a profile"):
        make_cost_model("table", spec)


def _roofline_profile(path: Path, roof: RooflineCostModel, tp: int = 1) -> Path:
    rows = []
    for batch in (1, 4, 16, 64):
        for context in (batch * 100, batch * 1000, batch * 4000):
            t = roof.step_time(decode_shape(batch, context))
            rows.append(ProfileRow("decode", decode_shape(batch, context), tp, t, t, t, 3))
    cpu = [ProfileRow("tokenize", EMPTY_SHAPE, 1, t, t, t, 1) for t in (2e-6, 4e-6)]
    provenance = {"hardware": "test cpu", "model": "test", "date": "2026-11-29", "command": "t"}
    write_profile(path, provenance, rows + cpu)
    return path


def test_table_model_recovers_a_linear_regime(tmp_path: Path) -> None:
    roof = RooflineCostModel(model_shape("llama-3.1-8b"), hardware("h200"))
    profile = read_profile(_roofline_profile(tmp_path / "p.csv", roof))
    table = TableCostModel(profile, tp=1)
    assert table.errors["fit"]["max"] < 1e-6
    for batch, context in ((2, 700), (30, 50_010)):
        shape = decode_shape(batch, context)
        assert table.step_time(shape) == pytest.approx(roof.step_time(shape), rel=1e-6)
    np.testing.assert_allclose(
        table.decode_times(8, 9000, 9000 // 8, 5),
        [table.step_time(decode_shape(8, 9000 + 8 * i)) for i in range(5)],
        rtol=1e-12,
    )
    assert "test cpu" in table.provenance and str(tmp_path) in table.provenance
    with pytest.raises(ProfileError, match="no step rows for tp=2"):
        TableCostModel(profile, tp=2)


def test_profile_needs_provenance_and_valid_rows(tmp_path: Path) -> None:
    row = "decode,0,1,10,10,10,0,1,1,0.001,0.001,0.001,3,fit,0.0008\n"
    bare = tmp_path / "bare.csv"
    bare.write_text(HEADER + row)
    with pytest.raises(ProfileError, match="provenance lacks"):
        read_profile(bare)
    (tmp_path / "bare.csv.json").write_text(
        '{"hardware": "h", "model": "m", "date": "d", "command": "c"}'
    )
    assert read_profile(bare).provenance["hardware"] == "h"
    bad = tmp_path / "bad.csv"
    bad.write_text(PROVENANCE + HEADER + row + "warp,0,1,1,1,1,0,1,1,1,1,1,1,fit,1\n")
    with pytest.raises(ProfileError, match=r"bad\.csv:7: unknown kind 'warp'"):
        read_profile(bad)
    bad.write_text(PROVENANCE + HEADER + "decode,0,x,10,10,10,0,1,1,0.001,0.001,0.001,3,fit,1\n")
    with pytest.raises(ProfileError, match=r"bad\.csv:6: non-numeric"):
        read_profile(bad)
    bad.write_text(PROVENANCE + HEADER + row.replace("fit", "test"))
    with pytest.raises(ProfileError, match=r"bad\.csv:6: split must be one of"):
        read_profile(bad)
    bad.write_text(PROVENANCE + HEADER + row.replace("0.0008", "fast"))
    with pytest.raises(ProfileError, match=r"bad\.csv:6: non-numeric device_s"):
        read_profile(bad)
    bad.write_text(PROVENANCE + HEADER + row.replace(",0.0008", ""))
    with pytest.raises(ProfileError, match=r"bad\.csv:6: expected 15 columns, got 14"):
        read_profile(bad)
    bad.write_text(
        PROVENANCE + "kind,prefill_tokens,decode_requests,context_tokens,tp,duration_s\n"
    )
    with pytest.raises(ProfileError, match=r"bad\.csv:5: expected header kind,"):
        read_profile(bad)


def test_cpu_costs_default_file_and_overrides(tmp_path: Path) -> None:
    default = load_cpu_costs(None)
    assert DEFAULT_CPU_PROFILE.samefile(default.source)
    assert 0 < default.tokenize < 1e-3 and 0 < default.ipc < 1e-2
    assert "engine profile" in default.provenance
    roof = RooflineCostModel(model_shape("smollm2-135m"), hardware("h200"))
    profile = read_profile(_roofline_profile(tmp_path / "p.csv", roof))
    mixed = load_cpu_costs(profile)
    assert mixed.tokenize == pytest.approx(3e-6)  # mean of the profile's rows
    assert mixed.ipc == default.ipc  # the rest from the default file


def test_busy_tokenize_rows_set_the_back_to_back_rate(tmp_path: Path) -> None:
    roof = RooflineCostModel(model_shape("smollm2-135m"), hardware("h200"))
    path = _roofline_profile(tmp_path / "p.csv", roof)  # tokenize: 3e-6 idle
    rows = [ProfileRow(f"tokenize_busy_{n}", EMPTY_SHAPE, 1, t, t, t, 1)
            for n, t in ((1, 1e-6), (4, 2e-6))]  # fmt: skip
    write_profile(path, read_profile(path).provenance, [*read_profile(path).steps, *rows])
    assert read_profile(path).cpu == {"tokenize_busy_1": 1e-6, "tokenize_busy_4": 2e-6}
    cpu = load_cpu_costs(read_profile(_roofline_profile(tmp_path / "q.csv", roof)))
    assert cpu.tokenize_busy == load_cpu_costs(None).tokenize_busy  # none: the fallback's
    busy = replace(cpu, tokenize_busy=((1, 1e-6), (4, 2e-6)))
    assert busy.tokenize_time(1000) == pytest.approx(3e-3)  # idle
    assert [busy.tokenize_time(1000, n) for n in (1, 3, 4, 9)] == pytest.approx(
        [1e-3, 1e-3, 2e-3, 2e-3]
    )  # the most workers measured, not above those busy
    assert cpu.tokenize_time(1000, 2) == cpu.tokenize_time(1000)  # unmeasured: the idle rate
    # a replay takes them only with the setting: off, every prompt at the idle rate
    for on, want in ((False, ()), (True, ((1, 1e-6), (4, 2e-6)))):
        config = build_config(model="smollm2-135m", cpu_profile=str(path), tokenize_busy=on)
        assert build_costs(config)[1].tokenize_busy == want
    bad = tmp_path / "bad.csv"
    bad.write_text(path.read_text().replace("tokenize_busy_4", "tokenize_busy_3"))
    with pytest.raises(ProfileError, match="unknown kind 'tokenize_busy_3'"):
        read_profile(bad)


def test_profile_device_times_round_trip_and_legacy_files(tmp_path: Path) -> None:
    shape = decode_shape(8, 800)
    rows = [ProfileRow("decode", shape, 1, 0.010, 0.009, 0.012, 3, "fit", 0.007)]
    rows.append(ProfileRow("tokenize", EMPTY_SHAPE, 1, 2e-6, 2e-6, 2e-6, 1))
    path = tmp_path / "p.csv"
    write_profile(path, {"hardware": "h", "model": "m", "date": "d", "command": "c"}, rows)
    profile = read_profile(path)
    assert profile.steps[0].device_time == pytest.approx(0.007)
    assert profile.steps[0].duration_s == pytest.approx(0.010)
    assert path.read_text().splitlines()[-1].endswith(",2.000000e-06")  # CPU rows: the wall time
    # a file written before device_s existed: its device time is its wall time
    legacy_header = ",".join(COLUMNS[:-1]) + "\n"
    path.write_text(
        PROVENANCE + legacy_header + "decode,0,1,10,10,10,0,1,1,0.001,0.001,0.002,3,fit\n"
    )
    (row,) = read_profile(path).steps
    assert row.device_s is None and row.device_time == row.duration_s == pytest.approx(0.001)
