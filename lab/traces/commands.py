"""Cut a shorter trace out of a trace file, in its own format, starting at 0."""

from __future__ import annotations

import argparse

from lab.tools import add_tool_group
from lab.traces import conversations, window

HELP = "cut a shorter trace out of a trace file: a window, or whole conversations"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim trace`` and its two tools."""
    add_tool_group(sub, "trace", help=HELP, doc=__doc__, tools=(window, conversations))
