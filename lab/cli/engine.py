"""The ``engine`` console script: ``serve``, ``setup``, ``profile``, ``bench`` and ``router``.

A command's module is imported only when the command runs or its parser is built (``load``),
so ``engine --help`` imports nothing heavy.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

COMMANDS = {
    "serve": "serve a model over HTTP",
    "setup": "convert a known model into the cache",
    "profile": "time the serving runner for the simulator",
    "bench": "replay a trace against a server",
    "router": "route requests over OpenAI servers",
}
"""Each command's name and its line in ``engine --help``, in that order."""


@dataclass(frozen=True, slots=True)
class Command:
    """A command's entry point (its arguments in, the exit status out) and its own parser."""

    run: Callable[[list[str]], int]
    parser: Callable[[], argparse.ArgumentParser]


def load(name: str) -> Command:
    """Command ``name``, its module imported now. The imports are statements, not module names
    in strings, so that the architecture contract (import-linter) sees them."""
    run: Callable[[list[str]], int]
    match name:
        case "serve":
            from engine.launch.serve import build_parser
            from engine.launch.serve import serve_main as run
        case "setup":
            from engine.models.setup import build_parser
            from engine.models.setup import setup_main as run
        case "profile":
            from lab.profile.main import build_parser
            from lab.profile.main import profile_main as run
        case "bench":
            from lab.bench.main import bench_main as run
            from lab.bench.main import build_parser
        case "router":
            from engine.router.main import build_parser
            from engine.router.main import router_main as run
        case _:
            raise KeyError(name)
    return Command(run, build_parser)


def build_parser() -> argparse.ArgumentParser:
    """The whole tree of ``engine``: every command with its own parser's flags and help (this
    imports every command's module, torch included)."""
    parser = argparse.ArgumentParser(prog="engine", description="The serving engine and its tools.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help in COMMANDS.items():
        own = load(name).parser()
        sub.add_parser(
            name,
            parents=[own],
            add_help=False,
            help=help,
            description=own.description,
            epilog=own.epilog,
            formatter_class=own.formatter_class,
        )
    return parser


def usage() -> str:
    lines = ["usage: engine COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<8} {help}" for name, help in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"engine: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return int(load(name).run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
