"""The tools on the step-time profiles that engine profile writes: merge them, compare two
engines' profiles, check a profile against a run."""

from __future__ import annotations

import argparse

from lab.profile import compare, merge, vs_record
from lab.tools import add_tool_group

HELP = "merge, compare and check step-time profiles (engine profile writes them)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim profile merge|compare|vs-record``."""
    add_tool_group(sub, "profile", help=HELP, doc=__doc__, tools=(merge, compare, vs_record))
