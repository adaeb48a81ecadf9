"""``sim profile``: the tools on step-time profiles (merge, compare, check against a run)."""

from __future__ import annotations

import argparse

from lab.profile import compare, merge, vs_record


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim profile merge|compare|vs-record``."""
    p = sub.add_parser(
        "profile",
        help="merge, compare and check step-time profiles (engine profile writes them)",
        description="Tools on the step-time profiles that engine profile writes.",
        epilog="examples:\n  sim profile merge A.csv B.csv --out AB.csv\n"
        "  sim profile compare --base OLD1.csv OLD2.csv --new NEW1.csv NEW2.csv\n"
        "(sim profile COMMAND --help: its flags)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tools = p.add_subparsers(dest="profile_command", required=True, metavar="COMMAND")
    for module in (merge, compare, vs_record):
        module.add_parser(tools)
