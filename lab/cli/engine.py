"""The ``engine`` console script: ``serve``, ``setup``, ``profile``, ``bench`` and ``router``.

Each command is a pair of functions that import its module only when called, so
``engine --help`` imports nothing heavy: ``run`` hands the command's arguments to
its ``*_main``, ``parser`` returns the command's own ``build_parser()``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass


def _serve(argv: list[str]) -> int:
    from engine.launch.serve import serve_main

    return serve_main(argv)


def _serve_parser() -> argparse.ArgumentParser:
    from engine.launch.serve import build_parser

    return build_parser()


def _setup(argv: list[str]) -> int:
    from engine.models.setup import setup_main

    return setup_main(argv)


def _setup_parser() -> argparse.ArgumentParser:
    from engine.models.setup import build_parser

    return build_parser()


def _profile(argv: list[str]) -> int:
    from lab.profile.main import profile_main

    return profile_main(argv)


def _profile_parser() -> argparse.ArgumentParser:
    from lab.profile.main import build_parser

    return build_parser()


def _bench(argv: list[str]) -> int:
    from lab.bench.main import bench_main

    return bench_main(argv)


def _bench_parser() -> argparse.ArgumentParser:
    from lab.bench.main import build_parser

    return build_parser()


def _router(argv: list[str]) -> int:
    from engine.router.main import router_main

    return router_main(argv)


def _router_parser() -> argparse.ArgumentParser:
    from engine.router.main import build_parser

    return build_parser()


@dataclass(frozen=True, slots=True)
class Command:
    run: Callable[[list[str]], int]
    parser: Callable[[], argparse.ArgumentParser]
    help: str


COMMANDS = {
    "serve": Command(_serve, _serve_parser, "serve a model over HTTP"),
    "setup": Command(_setup, _setup_parser, "convert a known model into the cache"),
    "profile": Command(_profile, _profile_parser, "time the serving runner for the simulator"),
    "bench": Command(_bench, _bench_parser, "replay a trace against a server"),
    "router": Command(_router, _router_parser, "route requests over OpenAI servers"),
}


def build_parser() -> argparse.ArgumentParser:
    """The whole tree of ``engine``: every command with its own parser's flags and help (this
    imports every command's module, torch included)."""
    parser = argparse.ArgumentParser(prog="engine", description="The serving engine and its tools.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        own = command.parser()
        sub.add_parser(
            name,
            parents=[own],
            add_help=False,
            help=command.help,
            description=own.description,
            epilog=own.epilog,
            formatter_class=own.formatter_class,
        )
    return parser


def usage() -> str:
    lines = ["usage: engine COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<8} {command.help}" for name, command in COMMANDS.items()]
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
    return int(COMMANDS[name].run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
