"""``sim colocation fit|share``: the co-location table of replicas that share a GPU."""

from __future__ import annotations

import argparse

from lab.colocation import fit, share


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim colocation`` and its two tools."""
    p = sub.add_parser(
        "colocation",
        help="fit and study the co-location table of replicas that share a GPU",
        description="How replicas sharing one GPU (engine serve --dp N --dp-share-gpu) stretch "
        "each other's steps: the table sim replay --colocation reads.",
        epilog="examples:\n  sim colocation fit STEPS.replica0.csv STEPS.replica1.csv "
        "--profile PROFILE.csv --out colocation.csv\n"
        "  sim colocation share RUN_DIR --profile PROFILE.csv\n"
        "(sim colocation COMMAND --help: its flags)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tools = p.add_subparsers(dest="colocation_command", required=True, metavar="COMMAND")
    for module in (fit, share):
        module.add_parser(tools)
