"""A run's steps against the same plans alone and against profiles' cost models, per kind.

    python scripts/record_vs_alone.py OUT_vs_record.csv --profile A.csv [B.csv ...]

Reads what ``engine profile --plans-from`` writes (each recorded step's device time in its
run, ``recorded_device_ms``, and the same plan's alone, ``alone_device_ms``) and prints, per
step kind, the summed device time of the run over the plans alone (serving's own share of a
step-time error) and of each profile's ``table`` model over the plans alone (the fit's
share), priced on the recorded shapes; and the median host launch of a step in the run and
alone, where the file has them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from core.scheduler.shape import StepShape
from schema.steprecord import SHAPE_COLUMNS
from sim.costs import TableCostModel, read_profile

KINDS = ("mixed", "decode", "prefill")


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("vs_record", type=Path, help="engine profile --plans-from's _vs_record.csv")
    p.add_argument("--profile", type=Path, nargs="+", required=True, help="profiles to price with")
    args = p.parse_args(argv)
    try:
        frame = pd.read_csv(args.vs_record)
        missing = {"kind", "recorded_device_ms", "alone_device_ms", *SHAPE_COLUMNS} - set(frame)
        if missing:
            raise ValueError(f"{args.vs_record} lacks the columns {sorted(missing)}")
        table = ratios(frame, args.profile)
    except (OSError, ValueError) as exc:
        print(f"record_vs_alone: error: {exc}", file=sys.stderr)
        return 2
    print(table.to_string(index=False, float_format="%.3f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
