"""``sim trace window|conversations``: cut a shorter trace out of a trace file."""

from __future__ import annotations

import argparse

from schema.traces import conversations, window


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim trace`` and its two tools."""
    p = sub.add_parser(
        "trace",
        help="cut a shorter trace out of a trace file: a window, or whole conversations",
        description="Cut a shorter trace out of a trace file, in its own format, starting at 0.",
        epilog="examples:\n  sim trace window traces/azure_code.csv --skip 3345 --limit 300 "
        "--out build/busy.csv\n  sim trace conversations traces/mooncake_conversation.jsonl "
        "--fraction 0.02 --out build/conv2pct.jsonl\n(sim trace COMMAND --help: its flags)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tools = p.add_subparsers(dest="trace_command", required=True, metavar="COMMAND")
    for module in (window, conversations):
        module.add_parser(tools)
