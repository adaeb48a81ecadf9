"""The difference between two policies' latency, real against simulated, from two validations.

Each folder holds the comparison.json of a sim validate of one policy (live, or
--real-from the runs of several folders). Prints each policy's real and
simulated value of the metric and their relative error, then the first policy's
value minus the second's in both worlds, and the simulated difference's error
against the real one: the figure a router policy's prediction is judged by.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.tools import add_tool

HELP = "two policies' latency difference, real against simulated, from two validations"
EXAMPLE = """example:
  sim policy-gap VALIDATE_ROUND_ROBIN/ VALIDATE_CACHE_AWARE/ --metric ttft_ms --quantile p90"""


def real_and_sim(folder: Path, metric: str, quantile: str) -> tuple[float, float]:
    """The real and the simulated value of ``metric`` at ``quantile`` in ``folder``."""
    path = folder / "comparison.json"
    if not path.is_file():
        raise ValueError(f"{folder} holds no comparison.json of a sim validate")
    try:
        entry = json.loads(path.read_text())[metric][quantile]
        return float(entry["real"]), float(entry["sim"])
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    except (KeyError, TypeError):
        raise ValueError(f"{path} has no {metric} {quantile}") from None


def relative(sim: float, real: float) -> str:
    """The simulated value's error against the real one, as a signed percentage."""
    return f"{sim / real - 1:+.1%}" if real else "-"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim policy-gap``: its flags and its handler."""
    p = add_tool(sub, "policy-gap", help=HELP, doc=__doc__, example=EXAMPLE)
    p.add_argument("first", type=Path, help="the sim validate folder of the first policy")
    p.add_argument("second", type=Path, help="the sim validate folder of the second policy")
    p.add_argument("--metric", default="ttft_ms", help="ttft_ms (default), tpot_ms, itl_ms, ...")
    p.add_argument("--quantile", default="p90", help="p50, p90 (default), p99 or mean")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        first = real_and_sim(args.first, args.metric, args.quantile)
        second = real_and_sim(args.second, args.metric, args.quantile)
    except (OSError, ValueError) as exc:
        print(f"sim policy-gap: error: {exc}", file=sys.stderr)
        return 2
    name = f"{args.metric} {args.quantile}"
    for folder, (real, sim) in ((args.first, first), (args.second, second)):
        print(f"{folder}: {name} real {real:,.1f}, simulated {sim:,.1f} ({relative(sim, real)})")
    real, sim = first[0] - second[0], first[1] - second[1]
    error = relative(sim, real) if real else "undefined (no real difference)"
    print(f"difference: real {real:,.1f}, simulated {sim:,.1f}, error {error}")
    return 0
