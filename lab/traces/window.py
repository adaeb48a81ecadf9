"""Cut a window out of a trace file, in its own format: rows SKIP .. SKIP + LIMIT.

Azure CSV keeps its header and rows as they are (its reader takes arrivals
relative to the first row); JSONL keeps its lines but for the timestamp, moved so
that the window's first request arrives at 0 (its reader takes timestamps as
they are). Either way the window starts at 0. The rows of both published formats
are in arrival order, so a row window is a time window.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.tools import add_tool
from schema.traces.window import cut_window

HELP = "cut rows SKIP .. SKIP + LIMIT out of a trace, in its own format"
EXAMPLE = """example:
  sim trace window traces/azure_code.csv --skip 3345 --limit 300 --out build/azure_code_busy.csv"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim trace window``: its flags and its handler."""
    p = add_tool(sub, "window", help=HELP, doc=__doc__, example=EXAMPLE)
    p.add_argument("trace", type=Path, help="a .jsonl (Mooncake fields) or Azure .csv trace")
    p.add_argument("--skip", type=int, default=0, help="requests to leave out first (default 0)")
    p.add_argument("--limit", type=int, required=True, help="requests to keep")
    p.add_argument("--out", type=Path, required=True, help="the window's trace file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        lines = cut_window(args.trace, args.skip, args.limit)
    except (OSError, ValueError) as exc:
        print(f"sim trace window: error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(lines), encoding="utf-8")
    last = args.skip + args.limit - 1
    print(f"wrote requests {args.skip}..{last} of {args.trace} to {args.out}")
    return 0
