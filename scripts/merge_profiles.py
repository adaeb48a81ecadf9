"""Merge profiles of one model on one kind of hardware into one: their step rows together.

    python scripts/merge_profiles.py FIRST.csv MORE.csv [...] --out MERGED.csv

A grid measured in two runs (a broad one, and one that adds points where the
first was thin) fits as one table. The first profile gives the CPU-stage and
copy rows and the provenance; every other profile's step rows are appended, and
its date, command and grid recorded as ``merged_N_date``, ``merged_N_command``
and ``merged_N_grid``; the table fit's errors are those of all the rows. The
profiles must name the same hardware, model and TP degree. Two machines of one
kind differ by a few percent (``reports/validate/capacity_h200/``, last
section): merge runs of one day, and say so where the profile is used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profiles", type=Path, nargs="+", help="the first gives CPU rows, provenance")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        profiles = [read_profile(path) for path in args.profiles]
        info, steps = merge(profiles)
        table = TableCostModel(Profile(str(args.out), info, steps), int(info.get("tp", "1")))
    except ProfileError as exc:
        print(f"merge_profiles: {exc}", file=sys.stderr)
        return 2
    info["table_fit"] = table.error_text()
    write_profile(args.out, info, steps + unit_rows(profiles[0]))
    print(f"wrote {args.out}: {len(steps)} step rows; {info['table_fit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
