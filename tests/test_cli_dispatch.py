"""The two console scripts: dispatch only, each command's arguments where the command lives, and
``build_parser()`` the whole tree of each (the CLI reference is generated from it)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from lab.cli import engine, sim

ROOT = Path(__file__).resolve().parents[1]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_the_sim_tree_holds_every_command_and_each_has_a_handler() -> None:
    tree = subcommands(sim.build_parser())
    assert {"replay", "gen", "validate", "sweep", "capacity"} <= set(tree)
    assert len(tree) == len(sim.COMMANDS)  # one registrant, one command
    for name, parser in tree.items():
        nested = subcommands(parser)
        for leaf in nested.values() or [parser]:
            assert callable(leaf.get_default("func")), name
    replay = tree["replay"]
    assert {"--overlap", "--no-overlap", "--replicas", "--router", "--max-running"} <= flags(replay)


@pytest.mark.parametrize("name", ["replay", "gen", "sweep", "capacity"])
def test_every_flag_of_the_simulators_own_commands_has_help(name: str) -> None:
    parser = subcommands(sim.build_parser())[name]
    bare = [a.dest for a in parser._actions if not a.help and a.dest != "help"]
    assert not bare


def test_the_engine_tree_is_each_commands_own_parser() -> None:
    tree = subcommands(engine.build_parser())
    assert list(tree) == ["serve", "setup", "profile", "bench", "router"]
    for name in engine.COMMANDS:
        own = engine.load(name).parser()
        assert flags(tree[name]) == flags(own), name
        assert tree[name].description == own.description


def test_engine_help_and_a_commands_help_import_no_torch() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from lab.cli.engine import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    assert main(['--help']) == 0\n"
        "    try:\n"
        "        main(['setup', '--help'])\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0\n"
        "assert 'engine setup' in out.getvalue(), out.getvalue()\n"
        "sys.exit('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_an_unknown_engine_command_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert engine.main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err
