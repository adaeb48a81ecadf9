"""Two engines' step times over one grid, plan by plan, measured in pairs: the speed-up.

Profiles of one grid (engine profile with the same arguments) measured in turn by
a baseline engine (the previous commit, in a worktree) and a changed one: pair N
is the Nth --base and the Nth --new profile, measured back to back, so that a
machine whose speed drifts over the hour moves both sides of a pair alike.
Prints a Markdown table, one row per plan of the first base profile (by kind and
size): its time in each profile (ms), base over new per pair, their median; then
the geometric mean of the medians and their range. A plan that a profile lacks
is an error: the two engines did not run the same grid. ``--measure`` picks the
time compared: the step's wall time (default), its device time, or its launch
(how long it held the host: an eagerly run step's launch bounds its device time).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from core.scheduler.shape import StepShape
from lab.tools import add_tool
from sim.costs.profile import Profile, ProfileError, read_profile
from sim.costs.table import MEASURES

Plan = tuple[str, StepShape, int]
HELP = "two engines' profiles of one grid, pair by pair: the speed-up per plan"
EXAMPLE = """example:
  sim profile compare --base PREV1.csv PREV2.csv PREV3.csv --new NEW1.csv NEW2.csv NEW3.csv"""


def step_times(profile: Profile, measure: str = "wall") -> dict[Plan, float]:
    """Each step plan's (kind, shape, TP degree) measured ``measure`` time, seconds."""
    times = {}
    for row in profile.steps:
        time = MEASURES[measure](row)
        if math.isnan(time):
            raise ProfileError(f"{profile.path} has no {measure} times")
        times[row.kind, row.shape, row.tp] = time
    return times


def describe(kind: str, shape: StepShape) -> str:
    """A plan in words: ``decode 16 x 2,049`` (requests x mean context), ``prefill 256 (context
    1,280)``, ``mixed 256 + 16 x 2,065``; padded when its decode rows differ in length."""
    decode = ""
    if shape.decode_requests:
        mean = shape.decode_context // shape.decode_requests
        decode = f"{shape.decode_requests} x {mean:,}"
        if shape.decode_padded != shape.decode_context:
            decode += f" (padded {shape.decode_padded:,})"
    prefill = f"{shape.prefill_tokens:,}"
    prefill_context = shape.context_tokens - shape.decode_context
    if prefill_context > shape.prefill_tokens:
        prefill += f" (context {prefill_context:,})"
    if kind == "decode":
        return f"decode {decode}"
    return f"{kind} {prefill}" + (f" + {decode}" if decode else "")


def order(plan: Plan) -> tuple[str, int, int, int, int]:
    """Plans by kind, then decode requests, decode context, prefill tokens and context."""
    kind, shape, _ = plan
    return (kind, shape.decode_requests, shape.decode_context, shape.prefill_tokens,
            shape.context_tokens)  # fmt: skip


def compare(
    base: list[Profile], new: list[Profile], measure: str = "wall"
) -> tuple[list[str], list[float]]:
    """The table's lines and each plan's median ratio (base time over new time)."""
    if len(base) != len(new) or not base:
        raise ProfileError(f"pairs need as many --base as --new profiles, got {len(base)} and "
                           f"{len(new)}")  # fmt: skip
    base_times = [step_times(p, measure) for p in base]
    new_times = [step_times(p, measure) for p in new]
    lines = [
        "| plan | base (ms) | new (ms) | base / new, per pair | median |",
        "|---|---|---|---|---|",
    ]
    medians = []
    for plan in sorted(base_times[0], key=order):
        for profile, times in zip([*base, *new], [*base_times, *new_times], strict=True):
            if plan not in times:
                raise ProfileError(f"{profile.path} has no {describe(plan[0], plan[1])}: "
                                   "not the grid of the other profiles")  # fmt: skip
        before = [t[plan] for t in base_times]
        after = [t[plan] for t in new_times]
        ratios = [b / a for b, a in zip(before, after, strict=True)]
        medians.append(statistics.median(ratios))
        lines.append(
            f"| {describe(plan[0], plan[1])} | {' / '.join(f'{t * 1e3:,.0f}' for t in before)} | "
            f"{' / '.join(f'{t * 1e3:,.0f}' for t in after)} | "
            f"{' / '.join(f'{r:.2f}' for r in ratios)} | **{medians[-1]:.2f}** |"
        )
    return lines, medians


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim profile compare``: its flags and its handler."""
    p = add_tool(sub, "compare", help=HELP, doc=__doc__, example=EXAMPLE)
    p.add_argument("--base", type=Path, nargs="+", required=True, help="the baseline's passes")
    p.add_argument("--new", type=Path, nargs="+", required=True, help="the change's, in order")
    p.add_argument("--measure", choices=tuple(MEASURES), default="wall",
                   help="the time compared: wall, device or launch (default wall)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        base = [read_profile(path) for path in args.base]
        new = [read_profile(path) for path in args.new]
        lines, medians = compare(base, new, args.measure)
        if not medians:
            raise ProfileError("the profiles hold no step rows")
    except ProfileError as exc:
        print(f"sim profile compare: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    geomean = math.exp(statistics.fmean(math.log(m) for m in medians))
    print(f"\n{len(medians)} plans: base / new {geomean:.2f} (geometric mean of the medians), "
          f"{min(medians):.2f}-{max(medians):.2f}")  # fmt: skip
    return 0
