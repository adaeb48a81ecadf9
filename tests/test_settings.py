"""Every setting is declared once and reaches what it sets unchanged, from every command.

The fields of ``SchedulerConfig`` are enumerated, each given a value other
than its default, and sent through ``engine serve`` (its flags, the config file
every process reads, and a live server whose rank 0 reports the core it built)
and through ``sim replay`` (its flags and a config file, into the core a
replay drives). The engine's own settings (``ServeConfig``, ``RunnerArgs``,
``LaunchOptions``) and the router's (``RouterConfig``, through ``engine serve
--dp``, ``sim replay`` and ``engine router``) are enumerated the same way. A
field added to any of them is covered without editing this file; one without a
flag, or whose flag does not arrive, fails it.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Sequence
from dataclasses import MISSING, Field, asdict, fields, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import running_server

from core.router import POLICIES as ROUTER_POLICIES
from core.router import RouterConfig
from core.router.options import ROUTER_KEYS, router_config, router_flag
from core.scheduler import POLICIES, SchedulerConfig
from core.scheduler.config import HOST_KV_POLICIES
from core.scheduler.options import flag
from core.settings import flag_of, settings_of
from engine.ipc.config import ServeConfig
from engine.launch.model_source import resolve_source
from engine.launch.options import LaunchOptions, launch_options
from engine.launch.serve import build_parser as serve_parser
from engine.launch.serve import make_config
from engine.router.main import build_parser as router_parser
from engine.runner.args import RunnerArgs
from engine.scheduler_proc.loop import runner_args
from lab.cli.sim import build_parser as sim_parser
from lab.replay.command import replay_config
from schema.traces import Trace, TraceRequest
from sim.config import SimConfig, build_config
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
    values = {f.name: changed_value(f.name, f.default) for f in settings_of(SchedulerConfig)}
    config = SchedulerConfig(**values)
    for f in settings_of(SchedulerConfig):
        assert getattr(config, f.name) != f.default, f.name
    return config


def as_flags(config: SchedulerConfig) -> list[str]:
    out: list[str] = []
    for f in settings_of(SchedulerConfig):
        name, value = f.name, getattr(config, f.name)
        if isinstance(value, bool):
            out.append(flag(name) if value else "--no-" + flag(name)[2:])
        else:
            out += [flag(name), str(value)]
    return out


def test_every_field_has_a_flag_with_its_help() -> None:
    text = serve_parser().format_help()
    for f in fields(SchedulerConfig):
        if "derived" in f.metadata:  # the role: each instance's, set by a launch
            continue
        assert f.metadata.get("help"), f"{f.name} has no help text"
        assert flag(f.name) in text, f"engine serve has no {flag(f.name)}"


def test_engine_serve_flags_reach_the_scheduler_process(tmp_path: Path) -> None:
    expected = changed()
    args = serve_parser().parse_args(["--model", PRESET, "--dummy-weights", *as_flags(expected)])
    source = resolve_source(args.model, args.tokenizer, args.dummy_weights)
    cfg = make_config(args, source, tmp_path, port=0)
    read = ServeConfig.load(cfg.save())  # what every child process reads
    assert read.scheduler == expected
    assert runner_args(read).scheduler == expected  # the runner builds the pool the core is told


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


# ----------------------------------------------------------- the engine's and the router's
ENGINE_CLASSES = (ServeConfig, RunnerArgs, LaunchOptions)
ROUTER_CHOICES = {"policy": sorted(ROUTER_POLICIES)}


def candidates(f: Field[Any], choices: Sequence[str] | None) -> list[Any]:
    """Values other than the field's default, by its choices or its type."""
    default = f.default
    if choices := choices or f.metadata.get("choices"):
        return [c for c in choices if c != default]
    kind = str(f.type)
    if kind.startswith("bool"):
        return [True if default is None else not default]
    if kind.startswith("int"):
        return [3 if default is None else default + 3]
    if kind.startswith("float"):
        return [2.5] if default is None else [default / 2, default * 2]
    if kind.startswith("str"):
        return ["changed"]
    raise AssertionError(f"no rule for a changed value of {f.name}: {kind}")


def changed_settings(cls: type, choices: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Every setting of ``cls`` but a required one, at a value other than its default that
    the class accepts."""
    out: dict[str, Any] = {}
    for f in settings_of(cls):
        if f.default is MISSING:
            continue
        for value in candidates(f, (choices or {}).get(f.name)):
            if cls is RouterConfig:
                try:
                    RouterConfig(**{f.name: value})
                except ValueError:
                    continue
            out[f.name] = value
            break
        else:
            raise AssertionError(f"no valid value other than the default for {f.name}")
    return out


def as_argv(cls: type, values: dict[str, Any]) -> list[str]:
    by_name = {f.name: f for f in fields(cls)}
    out: list[str] = []
    for name, value in values.items():
        option = flag_of(by_name[name])
        if isinstance(value, bool):
            out.append(option if value else "--no-" + option[2:])
        else:
            out += [option, str(value)]
    return out


def router_argv(config: RouterConfig, bare: bool = False) -> list[str]:
    """``config`` as ``--router-*`` flags, or (``bare``) as ``engine router``'s old names."""
    out: list[str] = []
    for key, name in ROUTER_KEYS.items():
        option = "--" + name.replace("_", "-") if bare else router_flag(key)
        out += [option, str(getattr(config, name))]
    return out


def has_option(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


@pytest.mark.parametrize("cls", [*ENGINE_CLASSES, RouterConfig], ids=lambda c: c.__name__)
def test_every_engine_and_router_field_has_a_flag_or_is_derived(cls: type) -> None:
    text = serve_parser().format_help()
    flags = {name: router_flag(key) for key, name in ROUTER_KEYS.items()}
    for f in fields(cls):
        if "derived" in f.metadata:
            continue
        assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has neither help nor a flag"
        option = flags[f.name] if cls is RouterConfig else flag_of(f)
        assert has_option(text, option), f"engine serve has no {option}"


def test_engine_serve_defaults_are_the_fields(tmp_path: Path) -> None:
    args = serve_parser().parse_args(["--model", PRESET])
    cfg = make_config(args, resolve_source(PRESET, None, True), tmp_path)
    for f in settings_of(ServeConfig):
        if f.name != "model":
            assert getattr(cfg, f.name) == f.default, f.name
    assert cfg.runner == RunnerArgs(model=PRESET)
    assert launch_options(args) == LaunchOptions()
    assert cfg.router == RouterConfig()


def test_engine_flags_reach_the_config_every_process_reads(tmp_path: Path) -> None:
    paths = {"record_steps": str(tmp_path / "steps.csv"), "host_profile": str(tmp_path / "prof")}
    changed = changed_settings(ServeConfig) | paths
    runner = changed_settings(RunnerArgs)
    # only --layout split has tokenizer workers to count: the layout goes in a run of its own
    layout = {"layout": changed.pop("layout")}
    for serve in (changed, layout):
        argv = ["--model", PRESET, *as_argv(ServeConfig, serve), *as_argv(RunnerArgs, runner)]
        args = serve_parser().parse_args(argv)
        cfg = make_config(args, resolve_source(PRESET, None, True), tmp_path)
        read = ServeConfig.load(cfg.save())
        assert {name: getattr(read, name) for name in serve} == serve
        assert {name: getattr(read.runner, name) for name in runner} == runner
    launch = changed_settings(LaunchOptions)
    args = serve_parser().parse_args(["--model", PRESET, *as_argv(LaunchOptions, launch)])
    assert launch_options(args) == LaunchOptions(**launch)


def test_router_flags_reach_the_router_core_from_every_command(tmp_path: Path) -> None:
    expected = RouterConfig(**changed_settings(RouterConfig, ROUTER_CHOICES))
    for f in fields(RouterConfig):
        assert getattr(expected, f.name) != f.default, f.name
    argv = router_argv(expected)
    serve = serve_parser().parse_args(["--model", PRESET, "--dummy-weights", *argv])
    cfg = make_config(serve, resolve_source(PRESET, None, True), tmp_path)
    assert ServeConfig.load(cfg.save()).router == expected
    sim = sim_parser().parse_args(["replay", "t.jsonl", "--out", "o", *argv])
    assert replay_config(sim).router == expected
    for bare in (False, True):  # engine router: the --router-* flags, and the fields' names
        args = router_parser().parse_args(["--worker", "http://w", *router_argv(expected, bare)])
        assert router_config(args) == expected


def test_router_defaults_are_the_fields(tmp_path: Path) -> None:
    assert router_config(router_parser().parse_args(["--worker", "http://w"])) == RouterConfig()
    sim = sim_parser().parse_args(["replay", "t.jsonl", "--out", "o"])
    assert replay_config(sim).router == RouterConfig()


def test_mem_fraction_is_one_setting_in_both_worlds(tmp_path: Path) -> None:
    assert RunnerArgs(model=PRESET).mem_fraction == SimConfig().mem_fraction == 0.85
    serve = serve_parser().parse_args(["--model", PRESET, "--mem-fraction", "0.5"])
    cfg = make_config(serve, resolve_source(PRESET, None, True), tmp_path)
    assert cfg.runner.mem_fraction == 0.5
    sim = replay_config(
        sim_parser().parse_args(["replay", "t", "--out", "o", "--mem-fraction", "0.5"])
    )
    assert sim.mem_fraction == 0.5
    assert sim.resolved_num_pages() < SimConfig().resolved_num_pages()
    path = tmp_path / "sim.toml"
    path.write_text("mem_fraction = 0.5\n")
    assert build_config(path).resolved_num_pages() == sim.resolved_num_pages()
    for argv in (["--model", PRESET, "--mem-fraction", "1.5"], ["--model", PRESET, "--tp", "0"]):
        with pytest.raises(SystemExit):
            serve_parser().parse_args(argv)
