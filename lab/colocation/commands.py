"""How replicas sharing one GPU (engine serve --dp N --dp-share-gpu) stretch each other's steps:
the co-location table that sim replay --colocation reads, fitted and studied."""

from __future__ import annotations

import argparse

from lab.colocation import fit, share
from lab.tools import add_tool_group

HELP = "fit and study the co-location table of replicas that share a GPU"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim colocation`` and its two tools."""
    add_tool_group(sub, "colocation", help=HELP, doc=__doc__, tools=(fit, share))
