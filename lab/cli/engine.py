"""The ``engine`` console script: ``serve``, ``setup``, ``profile``, ``bench`` and ``router``."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "serve": ("engine.launch.serve", "serve_main", "serve a model over HTTP"),
    "setup": ("engine.models.setup", "setup_main", "convert a known model into the cache"),
    "profile": ("lab.profile.main", "profile_main", "time the serving runner for the simulator"),
    "bench": ("lab.bench.main", "bench_main", "replay a trace against a server"),
    "router": ("engine.router.main", "router_main", "route requests over OpenAI servers"),
}


def usage() -> str:
    lines = ["usage: engine COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, _, help_) in COMMANDS.items()]
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
    module_name, func_name, _ = COMMANDS[name]
    module = importlib.import_module(module_name)
    result = getattr(module, func_name)(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
