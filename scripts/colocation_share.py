"""Does a co-located decode step's time depend on what runs beside it? Two fits, per run.

    python scripts/colocation_share.py RUN_DIR [RUN_DIR ...] --profile PROFILE.csv \\
        [--model qwen3-0.6b]

Each RUN_DIR holds the step records of two replicas that shared a GPU
(``steps.replica0.csv.gz``, ``steps.replica1.csv.gz``, as ``reports/cluster/``
keeps them). For every decode step that ran beside the other replica's decode
steps (covered for more than half its time, less than half by prefill steps),
with ``w`` its modelled time alone and ``v`` the other replica's work done
meanwhile (each overlapping step's modelled time alone, in proportion to the
overlap), the recorded device time is fitted over all runs as

    one line:   t = stretch * w + fixed              (the co-location table's form)
    shared:     t = a * w + b * v + c                 (what runs beside it counts)

and printed with the root mean square residual and, per run and replica, the error of
the summed time. A ``b`` near ``a`` and a smaller residual say the replicas share the GPU by
their steps' sizes: a step beside a larger one is stretched more than the table's
one factor per pair of kinds says, one beside a smaller one less.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schema.steprecord import read_step_record  # noqa: E402
from sim.config import build_config  # noqa: E402
from sim.costs.colocation import covered, gpu_intervals  # noqa: E402
from sim.costs.recorded import RecordedCostModel  # noqa: E402
from sim.replay import build_costs  # noqa: E402


def decode_pairs(run: Path, profile: str, model: str) -> pd.DataFrame:
    """The run's decode steps that ran beside decode steps: recorded, w and v (ms)."""
    config = build_config(None, model=model, profile=profile, overlap=True)
    gpu, _ = build_costs(config)
    records = []
    for k in (0, 1):
        record = read_step_record(run / f"steps.replica{k}.csv.gz")
        records.append(record[np.isfinite(record["device_ms"])].reset_index(drop=True))
    spans = [gpu_intervals(r) for r in records]
    models = [RecordedCostModel(r, gpu, True).model_device_s for r in records]
    rows = []
    for k in (0, 1):
        start, end = spans[k]
        o_start, o_end = spans[1 - k]
        prefill = records[1 - k]["prefill_tokens"].to_numpy() > 0
        length = np.maximum(end - start, 1e-12)
        near = covered(start, end, o_start, o_end) / length
        near_prefill = covered(start, end, o_start[prefill], o_end[prefill]) / length
        rate = models[1 - k] / np.maximum(o_end - o_start, 1e-12)  # its work per second
        v = covered(start, end, o_start, o_end, rate)
        keep = (records[k]["prefill_tokens"].to_numpy() == 0) & (near > 0.5) & (near_prefill < 0.5)
        frame = {"run": f"{run} r{k}", "recorded_ms": length[keep] * 1e3,
                 "w_ms": models[k][keep] * 1e3, "v_ms": v[keep] * 1e3}  # fmt: skip
        rows.append(pd.DataFrame(frame))
    return pd.concat(rows, ignore_index=True)


def fit(steps: pd.DataFrame) -> dict[str, np.ndarray]:
    """Both forms' coefficients: one line (stretch, fixed) and shared (a, b, c)."""
    ones = np.ones(len(steps))
    line = np.vstack([steps["w_ms"], ones]).T
    shared = np.vstack([steps["w_ms"], steps["v_ms"], ones]).T
    return {
        "line": np.linalg.lstsq(line, steps["recorded_ms"], rcond=None)[0],
        "shared": np.linalg.lstsq(shared, steps["recorded_ms"], rcond=None)[0],
    }


def predict(steps: pd.DataFrame, form: str, coef: np.ndarray) -> np.ndarray:
    if form == "line":
        return np.asarray(coef[0] * steps["w_ms"] + coef[1])
    return np.asarray(coef[0] * steps["w_ms"] + coef[1] * steps["v_ms"] + coef[2])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--profile", required=True)
    p.add_argument("--model", default="qwen3-0.6b")
    args = p.parse_args(argv)
    steps = pd.concat([decode_pairs(run, args.profile, args.model) for run in args.runs])
    coefs = fit(steps)
    a, b, c = coefs["shared"]
    stretch, fixed = coefs["line"]
    print(f"{len(steps)} decode steps beside decode steps, {len(args.runs)} runs")
    for form, text in (("line", f"t = {stretch:.3f} w + {fixed:.2f} ms"),
                       ("shared", f"t = {a:.3f} w + {b:.3f} v + {c:.2f} ms")):  # fmt: skip
        residual = steps["recorded_ms"] - predict(steps, form, coefs[form])
        print(f"  {form:<7} {text:<34} residual RMS {np.sqrt(np.mean(residual**2)):.2f} ms")
    print(f"  {'run, replica':<36}{'steps':>7}{'w ms':>7}{'v ms':>7}{'line':>8}{'shared':>8}")
    for run, group in steps.groupby("run", sort=False):
        errors = [predict(group, form, coefs[form]).sum() / group["recorded_ms"].sum() - 1
                  for form in ("line", "shared")]  # fmt: skip
        print(f"  {run:<36}{len(group):>7}{group['w_ms'].mean():>7.1f}{group['v_ms'].mean():>7.1f}"
              f"{errors[0]:>+8.1%}{errors[1]:>+8.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
