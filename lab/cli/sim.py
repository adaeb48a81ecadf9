"""The ``sim`` console script: dispatch only.

Each command's module defines its arguments, its run and what it prints, and registers
itself with one function, ``add_parser(sub)``: it adds its subparser (and any nested ones)
to ``sub`` and sets ``func``, the handler that takes the parsed arguments and returns the
exit status (``p.set_defaults(func=...)``). A new command is one more entry in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.runner.host_memory import keep_mmap_threshold
from lab.colocation import commands as colocation
from lab.profile import commands as profile
from lab.replay import command as replay
from lab.replay import gen
from lab.sweep.cli import add_capacity_parser, add_sweep_parser
from lab.traces import commands as trace
from lab.validate import policy_gap
from lab.validate.command import add_validate_args
from schema.traces import TraceError
from sim.costs import ProfileError

if TYPE_CHECKING:
    Registrant = Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]

COMMANDS: tuple[Registrant, ...] = (
    replay.add_parser,
    gen.add_parser,
    add_validate_args,
    add_sweep_parser,
    add_capacity_parser,
    profile.add_parser,
    colocation.add_parser,
    policy_gap.add_parser,
    trace.add_parser,
)
"""The commands of ``sim``, in the order ``sim --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The whole tree of ``sim``: every command and subcommand with its flags and help."""
    parser = argparse.ArgumentParser(prog="sim", description="Discrete-event LLM serving simulator")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_mmap_threshold()
    try:
        return int(args.func(args))
    except (TraceError, ProfileError, ValueError) as exc:
        print(f"sim {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
