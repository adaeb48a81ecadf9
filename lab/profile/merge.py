"""Merge profiles of one model on one kind of hardware into one: their step rows together.

A grid measured in two runs (a broad one, and one that adds points where the
first was thin) fits as one table. The first profile gives the CPU-stage and
copy rows and the provenance; every other profile's step rows are appended, and
its date, command and grid recorded as merged_N_date, merged_N_command and
merged_N_grid; the table fit's errors are those of all the rows. The profiles
must name the same hardware, model and TP degree. Two machines of one kind
differ by a few percent: merge runs of one day, and say so where the profile
is used.

With --median the profiles are passes of one grid, measured at different times
(on a shared machine whose speed drifts by tens of percent over an hour, passes
spread over the hour of the runs they price): each plan (kind, shape, split)
becomes one row, its time the median of the plan's passes (fastest and slowest
over all of them, the repeats summed), so that one pass caught on a slow minute
moves no plan. A plan missing from a pass is the median of the passes that
have it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from core.scheduler.shape import StepShape
from lab.tools import add_tool
from sim.costs.profile import (
    EMPTY_SHAPE,
    Profile,
    ProfileError,
    ProfileRow,
    read_profile,
    write_profile,
)
from sim.costs.table import TableCostModel

SAME = ("hardware", "model", "tp")
HELP = "merge profiles of one model and hardware into one"
EXAMPLE = """examples:
  sim profile merge FIRST.csv MORE.csv --out MERGED.csv
  sim profile merge PASS1.csv PASS2.csv PASS3.csv --median --out PROFILE.csv"""


def unit_rows(profile: Profile) -> list[ProfileRow]:
    """The CPU-stage and copy rows of ``profile`` (per-unit costs) as rows again."""
    return [ProfileRow(k, EMPTY_SHAPE, 1, c, c, c, 1) for k, c in profile.cpu.items()]


def merge(profiles: list[Profile]) -> tuple[dict[str, str], list[ProfileRow]]:
    """The merged provenance and step rows (module docstring)."""
    first = profiles[0]
    for other in profiles[1:]:
        for key in SAME:
            if first.provenance.get(key) != other.provenance.get(key):
                raise ProfileError(
                    f"{other.path} has {key} {other.provenance.get(key)!r}, "
                    f"{first.path} has {first.provenance.get(key)!r}: not one profile"
                )
    info = dict(first.provenance)
    steps = list(first.steps)
    for n, other in enumerate(profiles[1:], start=1):
        for key in ("date", "command", "grid"):
            if key in other.provenance:
                info[f"merged_{n}_{key}"] = other.provenance[key]
        steps += other.steps
    return info, steps


def median_rows(steps: list[ProfileRow]) -> list[ProfileRow]:
    """One row per plan (kind, shape, TP degree, split) of ``steps``: the median of its rows'
    times, in the order the plans first appear."""
    plans: dict[tuple[str, StepShape, int, str], list[ProfileRow]] = {}
    for row in steps:
        plans.setdefault((row.kind, row.shape, row.tp, row.split), []).append(row)
    out = []
    for (kind, shape, tp, split), rows in plans.items():
        device = [r.device_s for r in rows if r.device_s is not None]
        launch = [r.launch_s for r in rows if r.launch_s is not None]
        out.append(
            ProfileRow(
                kind,
                shape,
                tp,
                statistics.median(r.duration_s for r in rows),
                min(r.min_s for r in rows),
                max(r.max_s for r in rows),
                sum(r.repeats for r in rows),
                split,
                statistics.median(device) if len(device) == len(rows) else None,
                statistics.median(launch) if len(launch) == len(rows) else None,
            )
        )
    return out


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim profile merge``: its flags and its handler."""
    p = add_tool(sub, "merge", help=HELP, doc=__doc__, example=EXAMPLE)
    p.add_argument(
        "profiles", type=Path, nargs="+", help="profiles; the first gives CPU rows, provenance"
    )
    p.add_argument("--out", type=Path, required=True, help="the merged profile's CSV")
    p.add_argument(
        "--median", action="store_true", help="passes of one grid: each plan the median of its rows"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        profiles = [read_profile(path) for path in args.profiles]
        info, steps = merge(profiles)
        if args.median:
            steps = median_rows(steps)
            info["passes"] = f"{len(profiles)}, each plan the median of its passes"
        table = TableCostModel(Profile(str(args.out), info, steps), int(info.get("tp", "1")))
    except ProfileError as exc:
        print(f"sim profile merge: error: {exc}", file=sys.stderr)
        return 2
    info["table_fit"] = table.error_text()
    write_profile(args.out, info, steps + unit_rows(profiles[0]))
    print(f"wrote {args.out}: {len(steps)} step rows; {info['table_fit']}")
    return 0
