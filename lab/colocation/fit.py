"""Measure how replicas sharing a GPU stretch each other's steps: a co-location table.

The step records are those of engine serve --dp N --dp-share-gpu --record-steps
STEPS.csv (one file per replica, or one file with a replica column as engine
bench --server-steps writes it); the profile is the replicas' model measured
alone on that GPU. CPU replicas (engine serve --dp N on CPU) share the host's
cores instead; their records have no device time and their steps count from the
end of schedule to done. --run adds the records of another run (at another load:
the table is fitted to all runs' steps together). The table
(sim.costs.colocation) is what sim replay --colocation FILE and sim validate
--colocation FILE read.

--check TABLE instead prices the recorded steps with a table and prints, per
pair of kinds, the recorded and the priced device time: the table's own error on
the plans that ran, apart from what a simulation of the run adds (other plans,
other neighbours).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from lab.tools import add_tool
from schema.steprecord import REPLICA_COLUMN, read_step_record
from sim.config import build_config
from sim.costs.colocation import (
    FORMS,
    Colocation,
    check_colocation,
    fit_colocation,
    read_colocation,
)
from sim.replay import build_costs

HELP = "fit a co-location table to the step records of replicas sharing a GPU"
EXAMPLE = """examples:
  sim colocation fit STEPS.replica0.csv STEPS.replica1.csv --profile PROFILE.csv \\
      --model qwen3-0.6b --out colocation.csv
  sim colocation fit STEPS.replica0.csv STEPS.replica1.csv --run OTHER.replica0.csv \\
      OTHER.replica1.csv --form ratio --profile PROFILE.csv --out colocation.csv
  sim colocation fit STEPS.replica0.csv STEPS.replica1.csv --check colocation.csv \\
      --profile PROFILE.csv --model qwen3-0.6b"""


def replica_records(paths: list[Path]) -> list[pd.DataFrame]:
    """One step record per replica, from per-replica files or files with a ``replica`` column."""
    out = []
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path}: no such step record")
        record = read_step_record(path)
        if REPLICA_COLUMN in record:
            out += [r.drop(columns=REPLICA_COLUMN) for _, r in record.groupby(REPLICA_COLUMN)]
        else:
            out.append(record)
    return out


def print_check(pairs: dict[tuple[str, str], tuple[int, float, float]]) -> None:
    """Print a table's price of recorded steps against their recorded device time."""
    print(f"{'step':<9}{'beside':<9}{'steps':>8}{'recorded s':>12}{'table s':>10}{'error':>9}")
    for (kind, other), (steps, recorded, priced) in pairs.items():
        error = f"{(priced / recorded - 1) * 100:+.1f}%" if recorded > 0 else "-"
        print(f"{kind:<9}{other:<9}{steps:>8}{recorded:>12.2f}{priced:>10.2f}{error:>9}")
    recorded, priced = (sum(v[i] for v in pairs.values()) for i in (1, 2))
    print(f"{'all':<18}{sum(v[0] for v in pairs.values()):>8}{recorded:>12.2f}{priced:>10.2f}"
          f"{(priced / recorded - 1) * 100:>+8.1f}%")  # fmt: skip


def print_table(table: Colocation, out: Path) -> None:
    """Print a fitted table, row by row, and warn of the pairs of kinds no step showed."""
    print(f"{'step':<9}{'beside':<9}{'stretch':>9}{'fixed ms':>10}{'steps':>8}")
    for (kind, other), value in sorted(table.stretch.items()):
        fixed_ms = table.fixed.get((kind, other), 0.0) * 1e3
        print(f"{kind:<9}{other:<9}{value:>9.3f}{fixed_ms:>10.2f}{table.steps[kind, other]:>8}")
    print(f"wrote {out}")
    if table.missing():
        why = "the simulator needs each (add rows by hand, or record a run that has them)"
        print(f"warning: no recorded step of {table.missing()}: {why}", file=sys.stderr)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim colocation fit``: its flags and its handler."""
    p = add_tool(sub, "fit", help=HELP, doc=__doc__, example=EXAMPLE)
    p.add_argument("records", type=Path, nargs="+", help="the replicas' step records")
    p.add_argument("--run", type=Path, nargs="+", action="append", default=[],
                   help="another run's step records (repeatable)")  # fmt: skip
    p.add_argument("--form", choices=FORMS, default="affine",
                   help="per pair of kinds a stretch and a fixed time, or a stretch")  # fmt: skip
    p.add_argument("--profile", required=True, help="the model's profile, measured alone")
    p.add_argument("--model", help="the model preset (default: the simulator's default)")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", type=Path, help="the table's CSV")
    out.add_argument("--check", type=Path, help="price the recorded steps with this table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = build_config(None, model=args.model, profile=args.profile, overlap=True)
        gpu, _ = build_costs(config)
        runs = [args.records, *args.run]
        records = [replica_records(run) for run in runs]
        if args.check:
            print_check(check_colocation(read_colocation(args.check), records, gpu))
            return 0
        names = "; ".join(", ".join(str(path) for path in run) for run in runs)
        table = fit_colocation(records, gpu, f"fitted to {names}", args.form)
    except (OSError, ValueError) as exc:
        print(f"sim colocation fit: error: {exc}", file=sys.stderr)
        return 2
    table.write(args.out)
    print_table(table, args.out)
    return 0
