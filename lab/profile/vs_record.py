"""A run's steps against the same plans alone and against profiles' cost models, per kind.

Reads what engine profile --plans-from writes (FILE_vs_record.csv: each recorded
step's device time in its run, recorded_device_ms, and the same plan's alone,
alone_device_ms) and prints, per step kind, the summed device time of the run
over the plans alone (serving's own share of a step-time error) and of each
profile's table model over the plans alone (the fit's share), priced on the
recorded shapes; and the median host launch of a step in the run and alone,
where the file has them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from core.scheduler.shape import StepShape
from lab.tools import add_tool
from schema.steprecord import SHAPE_COLUMNS
from sim.costs import TableCostModel, read_profile

KINDS = ("mixed", "decode", "prefill")
COLUMNS = ("kind", "recorded_device_ms", "alone_device_ms", *SHAPE_COLUMNS)
HELP = "a run's steps over the same plans alone, and each profile's model over them"
EXAMPLE = """example:
  sim profile vs-record OUT_vs_record.csv --profile profiles/h200_llama-3.1-8b.csv"""


def ratios(frame: pd.DataFrame, profiles: list[Path]) -> pd.DataFrame:
    """One row per kind: steps, run/alone, and table/alone per profile (summed times)."""
    models = {str(p): TableCostModel(read_profile(p)) for p in profiles}
    shapes = [StepShape(*(int(v) for v in row)) for row in frame[list(SHAPE_COLUMNS)].values]
    for name, model in models.items():
        frame[name] = [model.device_time(s) * 1e3 for s in shapes]
    rows = []
    for kind in KINDS:
        part = frame[frame["kind"] == kind]
        if part.empty:
            continue
        alone = part["alone_device_ms"].sum()
        row = {
            "kind": kind,
            "steps": len(part),
            "run/alone": part["recorded_device_ms"].sum() / alone,
        }
        row |= {f"{name}/alone": part[name].sum() / alone for name in models}
        for where in ("recorded", "alone"):  # the host's launch, median ms (newer files)
            if f"{where}_launch_ms" in part:
                row[f"launch ms ({where})"] = part[f"{where}_launch_ms"].median()
        rows.append(row)
    return pd.DataFrame(rows)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim profile vs-record``: its flags and its handler."""
    p = add_tool(sub, "vs-record", help=HELP, doc=__doc__, example=EXAMPLE)
    p.add_argument("vs_record", type=Path, help="engine profile --plans-from's _vs_record.csv")
    p.add_argument("--profile", type=Path, nargs="+", required=True, help="profiles to price with")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if not args.vs_record.is_file():
            raise ValueError(f"{args.vs_record}: no such file")
        frame = pd.read_csv(args.vs_record)
        missing = set(COLUMNS) - set(frame)
        if missing:
            raise ValueError(f"{args.vs_record} lacks the columns {sorted(missing)}")
        table = ratios(frame, args.profile)
    except (OSError, ValueError) as exc:
        print(f"sim profile vs-record: error: {exc}", file=sys.stderr)
        return 2
    print(table.to_string(index=False, float_format="%.3f"))
    return 0
