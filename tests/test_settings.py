"""Every scheduler setting is declared once and reaches the core unchanged from both worlds.

The fields of ``SchedulerConfig`` are enumerated, each given a value other
than its default, and sent through ``engine serve`` (its flags, the config file
every process reads, and a live server whose rank 0 reports the core it built)
and through ``sim replay`` (its flags and a config file, into the core a
replay drives). A field added to ``SchedulerConfig`` is covered without
editing this file; one that does not arrive fails it.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import running_server

from core.scheduler import POLICIES, SchedulerConfig
from core.scheduler.config import HOST_KV_POLICIES
from core.scheduler.options import flag
from engine.ipc.config import ServeConfig
from engine.launch.model_source import resolve_source
from engine.launch.serve import build_parser as serve_parser
from engine.launch.serve import make_config
from engine.scheduler_proc.loop import runner_args
from lab.cli.sim import build_parser as sim_parser
from lab.cli.sim import replay_config
from schema.traces import Trace, TraceRequest
from sim.config import build_config
from sim.replay import run_replay

PRESET = "tiny-llama"


def changed_value(name: str, default: Any) -> Any:
    """A valid value other than the default, by the field's type."""
    if isinstance(default, bool):
        return not default
    if name == "policy":
        return next(p for p in sorted(POLICIES) if p != default)
    if name == "host_kv_policy":
        return next(p for p in HOST_KV_POLICIES if p != default)
    if name == "host_kv_gb":  # 0: the tier is off
        return 1.5
    if default is None:  # num_pages: left out means "sized from memory"
        return 97
    if isinstance(default, int):
        return default + 3
    if isinstance(default, float):
        return default / 2
    raise AssertionError(f"no rule for a changed value of {name}={default!r}: add one")


def changed() -> SchedulerConfig:
    values = {f.name: changed_value(f.name, f.default) for f in fields(SchedulerConfig)}
    config = SchedulerConfig(**values)
    for f in fields(SchedulerConfig):
        assert getattr(config, f.name) != f.default, f.name
    return config


def as_flags(config: SchedulerConfig) -> list[str]:
    out: list[str] = []
    for name, value in asdict(config).items():
        if isinstance(value, bool):
            out.append(flag(name) if value else "--no-" + flag(name)[2:])
        else:
            out += [flag(name), str(value)]
    return out


def test_every_field_has_a_flag_with_its_help() -> None:
    text = serve_parser().format_help()
    for f in fields(SchedulerConfig):
        assert f.metadata.get("help"), f"{f.name} has no help text"
        assert flag(f.name) in text, f"engine serve has no {flag(f.name)}"


def test_engine_serve_flags_reach_the_scheduler_process(tmp_path: Path) -> None:
    expected = changed()
    args = serve_parser().parse_args(["--model", PRESET, "--dummy-weights", *as_flags(expected)])
    source = resolve_source(args.model, args.tokenizer, args.dummy_weights)
    cfg = make_config(args, source, tmp_path, port=0)
    read = ServeConfig.load(cfg.save())  # what every child process reads
    assert read.scheduler == expected
    runner = runner_args(read)  # the runner sizes the pool the core is told
    assert (runner.num_pages, runner.page_size) == (expected.num_pages, expected.page_size)
    assert runner.max_running == expected.max_running


def test_engine_serve_defaults_are_the_cores(tmp_path: Path) -> None:
    args = serve_parser().parse_args(["--model", PRESET, "--dummy-weights"])
    cfg = make_config(args, resolve_source(PRESET, None, True), tmp_path, port=0)
    assert cfg.scheduler == SchedulerConfig()


@pytest.mark.slow
def test_a_live_server_runs_the_core_it_was_given(model_ready: str) -> None:
    """Rank 0 reports the configuration of the core it built; the model card shows it."""
    expected = replace(changed(), page_size=16, num_pages=300, max_running=8)
    with running_server("--dummy-weights", *as_flags(expected), model=PRESET) as server:
        card = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]
    assert not expected.prefix_cache  # no prefix cache, so no pages for a host tier under it
    assert SchedulerConfig(**card["scheduler"]) == replace(expected, host_kv_pages=0)


def replay_core(config_args: list[str], trace: Trace) -> SchedulerConfig:
    args = sim_parser().parse_args(["replay", "t.jsonl", "--out", "o", *config_args])
    result = run_replay(trace, replay_config(args), record_calls=True, progress=False)
    core: SchedulerConfig = result.scheduler.inner.config
    return core


@pytest.fixture
def trace() -> Trace:
    requests = [TraceRequest(f"r{i}", 0.01 * i, 64, 4) for i in range(4)]
    return Trace("t.jsonl", "jsonl", requests)


def test_sim_replay_flags_reach_the_core(trace: Trace) -> None:
    expected = changed()
    assert replay_core(as_flags(expected), trace) == expected


def test_sim_replay_config_file_reaches_the_core(trace: Trace, tmp_path: Path) -> None:
    expected = changed()
    lines = ["[scheduler]"] + [f"{k} = {json.dumps(v)}" for k, v in asdict(expected).items()]
    path = tmp_path / "sim.toml"
    path.write_text("\n".join(lines) + "\n")
    assert tomllib.loads(path.read_text())["scheduler"]["policy"] == expected.policy
    assert replay_core(["--config", str(path)], trace) == expected


def test_sim_replay_flags_override_the_config_file(trace: Trace, tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    path.write_text(json.dumps({"max_running": 5, "num_pages": 400}))
    core = replay_core(["--config", str(path), "--max-running", "6"], trace)
    assert (core.max_running, core.num_pages) == (6, 400)
    assert build_config(path).scheduler_config().max_running == 5


def test_sim_replay_defaults_are_the_cores(trace: Trace) -> None:
    core = replay_core([], trace)
    assert replace(core, num_pages=None) == SchedulerConfig()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--page-size", "0"], "page_size must be a positive integer"),
        (["--init-new-token-ratio", "0.01"], "new-token ratios must satisfy"),
    ],
)
def test_a_bad_setting_is_the_same_error_in_both_worlds(
    argv: list[str], message: str, tmp_path: Path
) -> None:
    args = serve_parser().parse_args(["--model", PRESET, "--dummy-weights", *argv])
    with pytest.raises(ValueError, match=message):
        make_config(args, resolve_source(PRESET, None, True), tmp_path, port=0)
    with pytest.raises(ValueError, match=message):
        replay_config(sim_parser().parse_args(["replay", "t.jsonl", "--out", "o", *argv]))
