"""The honest default: a committed profile of the model on the hardware prices the steps unless
the roofline is asked for; the roofline otherwise, and every summary says which and why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab.cli.sim import main
from lab.sweep.sweep import plan_grid
from sim.config import build_config
from sim.costs import ProfileError, read_profile
from sim.costs.committed import PROFILES_DIR, committed_profile
from sim.costs.presets import HARDWARE

ROOT = Path(__file__).resolve().parents[1]
H200 = PROFILES_DIR / "h200_llama-3.1-8b.csv"


def test_the_committed_profile_is_the_default() -> None:
    config = build_config()
    assert (config.model, config.hardware, config.tp) == ("llama-3.1-8b", "h200", 1)
    assert config.cost_model == "table" and Path(config.profile or "").resolve() == H200
    assert config.cost_model_by_default
    assert config.cost_model_choice().startswith("by default: the committed profile of ")
    # asking for the table model without a profile picks the same file
    assert build_config(cost_model="table").profile == config.profile


@pytest.mark.parametrize(
    ("asked", "by_default"),
    [({"cost_model": "roofline"}, False), ({"tp": 2}, True), ({"dtype": "fp16"}, True),
     ({"model": "qwen3-0.6b"}, True), ({"kv_dtype": "fp8"}, True)],
)  # fmt: skip
def test_the_roofline_on_request_or_without_a_profile(
    asked: dict[str, object], by_default: bool
) -> None:
    config = build_config(**asked)
    assert config.cost_model == "roofline" and config.profile is None
    assert config.cost_model_by_default is by_default
    expected = "by default: no profile of " if by_default else "as requested"
    assert config.cost_model_choice().startswith(expected)


def test_a_given_profile_is_as_requested(tmp_path: Path) -> None:
    other = ROOT / "profiles" / "cpu-xeon-2core_smollm2-135m_bf16.csv"
    config = build_config(profile=str(other), model="smollm2-135m")
    assert config.cost_model == "table" and not config.cost_model_by_default
    assert config.cost_model_choice() == "as requested"


def test_committed_profiles_agree_with_their_names(tmp_path: Path) -> None:
    found = 0
    for path in PROFILES_DIR.glob("*.csv"):
        hardware, _, rest = path.stem.partition("_")
        if hardware not in HARDWARE:
            continue
        model, _, tp = rest.partition("_tp")
        p = read_profile(path)
        dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[p.provenance["dtype"]]
        assert committed_profile(model, hardware, int(tp or 1), dtype, dtype) == path
        found += 1
    assert found >= 1
    liar = tmp_path / "h200_qwen3-0.6b.csv"  # named for one model, measured on another
    shutil.copy(H200, liar)
    with pytest.raises(ProfileError, match=r"named for qwen3-0\.6b at tp 1, but its header says"):
        committed_profile("qwen3-0.6b", "h200", 1, "bf16", "bf16", folder=tmp_path)


def test_replay_names_its_cost_model_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = ROOT / "traces" / "azure_conv.csv"
    base = ["replay", str(trace), "--limit", "40", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "d")]) == 0
    report = (tmp_path / "d" / "report.html").read_text()
    assert "table, profile profiles/h200_llama-3.1-8b.csv (by default: the committed" in report
    base.append("--no-report")
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    cm = summary["cost_model"]
    assert cm["name"] == "table" and cm["profile"].endswith("h200_llama-3.1-8b.csv")
    assert cm["chosen"].startswith("by default: the committed profile of llama-3.1-8b on h200")
    assert summary["config"]["cost_model_by_default"] is True
    assert "cost model   table (profile: " in printed and "chosen       by default: " in printed
    # the profile's engine overlaps on CUDA, so the replay does, unasked, and says so
    assert summary["config"]["overlap"] is True and summary["config"]["overlap_by_default"]
    assert "overlap      on (the profile's engine runs it on cuda;" in printed
    assert "CUDA engine" not in printed  # no warning to add --overlap: the default is it
    assert main([*base, "--cost-model", "roofline", "--out", str(tmp_path / "r")]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["cost_model"]["name"] == "roofline"
    assert summary["cost_model"]["chosen"] == "as requested"
    assert summary["config"]["overlap"] is False  # no profile, no engine's loop to follow
    assert "overlap      off (no profile names an engine" in capsys.readouterr().out
    assert main([*base, "--no-overlap", "--out", str(tmp_path / "o")]) == 0
    assert "overlap      off (as requested)" in capsys.readouterr().out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["config"]["overlap"] is False and summary["overlap"] == "off (as requested)"
    host = "profiles/cpu-epyc-2core_smollm2-135m.csv"  # CPU stage costs of another host first
    assert main([*base, "--cpu-profile", host, "--out", str(tmp_path / "c")]) == 0
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["cpu_costs"]["source"].startswith(f"{host} over ")


def test_sweeps_build_their_configs_the_same_way(tmp_path: Path) -> None:
    trace = ROOT / "traces" / "azure_code.csv"
    grid: dict[str, list[object]] = {"cost_model": ["roofline", "table"], "rate_scale": [1.0]}
    plan = plan_grid(grid, trace, 10, None, {})
    chosen = [(p.config["cost_model"], p.config["cost_model_by_default"]) for p in plan.probes]
    assert chosen == [("roofline", False), ("table", True)]
    plan = plan_grid({"policy": ["fcfs"]}, trace, 10, None, {})
    assert plan.probes[0].config["cost_model"] == "table"


def test_the_loop_follows_the_profiles_engine_unless_asked(tmp_path: Path) -> None:
    """A CUDA profile's engine overlaps scheduling, a CPU profile's does not; a flag, a config
    file or a grid knob overrides that, in sim replay, sweep and capacity alike."""
    cpu = "profiles/cpu-xeon-2core_smollm2-135m.csv"
    assert read_profile(H200).provenance["device"] == "cuda"
    assert read_profile(ROOT / cpu).provenance["device"] == "cpu"
    cuda_default = build_config()
    assert (cuda_default.overlap, cuda_default.overlap_by_default) == (True, True)
    assert cuda_default.overlap_choice().startswith("on (the profile's engine runs it on cuda")
    on_cpu = build_config(model="smollm2-135m", profile=str(ROOT / cpu))
    assert (on_cpu.overlap, on_cpu.overlap_by_default) == (False, True)
    assert "strict loop" in on_cpu.overlap_choice()
    asked = build_config(overlap=False)
    assert (asked.overlap, asked.overlap_by_default) == (False, False)
    config_file = tmp_path / "c.toml"
    config_file.write_text("overlap = false\n")
    assert build_config(config_file).overlap is False
    trace = ROOT / "traces" / "azure_code.csv"
    plan = plan_grid({"overlap": [False, True], "max_running": [64]}, trace, 10, None, {})
    assert [p.config["overlap"] for p in plan.probes] == [False, True]
    plan = plan_grid({"max_running": [64]}, trace, 10, None, {"overlap": None})
    assert plan.probes[0].config["overlap"] is True  # the committed H200 profile's engine
    plan = plan_grid({"max_running": [64]}, trace, 10, None, {"overlap": False})
    assert plan.probes[0].config["overlap"] is False
