"""Does a co-located decode step's time depend on the size of the steps beside it? Two fits.

    python scripts/colocation_share.py RUN_DIR [RUN_DIR ...] --profile PROFILE.csv \\
        [--model qwen3-0.6b]

Each RUN_DIR holds the step records of two replicas that shared a GPU
(``steps.replica0.csv.gz``, ``steps.replica1.csv.gz``, as ``reports/cluster/``
keeps them). For every decode step that ran beside the other replica's steps of one
kind (``decode`` or ``prefill``, as ``sim.costs.colocation`` assigns it), with ``w`` its
modelled time alone and ``u`` the modelled time alone of the other replica's steps of
that kind beside it (their mean, weighted by overlap), the recorded device time is
fitted per pair of kinds over all runs as

    one line:   t = stretch * w + fixed              (the co-location table's form)
    size:       t = a * w + b * u + c                 (the neighbour's size counts)

and printed with the root mean square residual and, per run and replica, the error of
the summed time: what a table of that form would get wrong on the plans that ran.

``u`` is the neighbours' size, not their work done during the step: that work is their
speed times the step's own duration, so a fit on it explains the duration by itself
(it halved the residual of decode beside decode and cut that of decode beside prefill
from 8.7 to 3.3 ms on the H200 runs, and would have done so for any data).
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
from sim.costs.colocation import KINDS, covered, gpu_intervals, kind_of, timed_steps  # noqa: E402
from sim.costs.recorded import RecordedCostModel  # noqa: E402
from sim.replay import build_costs  # noqa: E402

FORMS = ("line", "size")


def decode_steps(run: Path, profile: str, model: str) -> pd.DataFrame:
    """The run's decode steps beside the other replica's steps: the kind beside, recorded,
    w and u (ms)."""
    config = build_config(None, model=model, profile=profile, overlap=True)
    gpu, _ = build_costs(config)
    records = []
    for k in (0, 1):
        records.append(timed_steps(read_step_record(run / f"steps.replica{k}.csv.gz")))
    spans = [gpu_intervals(r) for r in records]
    models = [RecordedCostModel(r, gpu, True).model_device_s for r in records]
    rows = []
    for k in (0, 1):
        start, end = spans[k]
        o_start, o_end = spans[1 - k]
        o_kind = np.array([kind_of(int(p)) for p in records[1 - k]["prefill_tokens"]])
        length = np.maximum(end - start, 1e-12)
        cover = {kind: covered(start, end, o_start[o_kind == kind], o_end[o_kind == kind])
                 for kind in KINDS}  # fmt: skip
        beside = np.where(cover["prefill"] > cover["decode"], "prefill", "decode")
        size = np.zeros(len(start))
        for kind in KINDS:
            mine = o_kind == kind
            summed = covered(start, end, o_start[mine], o_end[mine], models[1 - k][mine])
            size = np.where(beside == kind, summed / np.maximum(cover[kind], 1e-12), size)
        near = (cover["decode"] + cover["prefill"]) / length
        keep = (records[k]["prefill_tokens"].to_numpy() == 0) & (near >= 0.5)
        frame = {"run": f"{run.parent.name}/{run.name} r{k}", "beside": beside[keep],
                 "recorded_ms": length[keep] * 1e3, "w_ms": models[k][keep] * 1e3,
                 "u_ms": size[keep] * 1e3}  # fmt: skip
        rows.append(pd.DataFrame(frame))
    return pd.concat(rows, ignore_index=True)


def design(steps: pd.DataFrame, form: str) -> np.ndarray:
    ones = np.ones(len(steps))
    columns = [steps["w_ms"], ones] if form == "line" else [steps["w_ms"], steps["u_ms"], ones]
    return np.vstack(columns).T


def fit(steps: pd.DataFrame) -> dict[str, np.ndarray]:
    """Both forms' coefficients: one line (stretch, fixed) and size (a, b, c)."""
    return {
        form: np.linalg.lstsq(design(steps, form), steps["recorded_ms"], rcond=None)[0]
        for form in FORMS
    }


def report(beside: str, steps: pd.DataFrame) -> None:
    coefs = fit(steps)
    stretch, fixed = coefs["line"]
    a, b, c = coefs["size"]
    print(f"{len(steps)} decode steps beside {beside} steps")
    for form, text in (("line", f"t = {stretch:.3f} w + {fixed:.2f} ms"),
                       ("size", f"t = {a:.3f} w + {b:.3f} u + {c:.2f} ms")):  # fmt: skip
        residual = steps["recorded_ms"] - design(steps, form) @ coefs[form]
        print(f"  {form:<7} {text:<34} residual RMS {np.sqrt(np.mean(residual**2)):.2f} ms")
    print(f"  {'run, replica':<36}{'steps':>7}{'w ms':>7}{'u ms':>7}{'line':>8}{'size':>8}")
    for run, group in steps.groupby("run", sort=False):
        errors = [(design(group, form) @ coefs[form]).sum() / group["recorded_ms"].sum() - 1
                  for form in FORMS]  # fmt: skip
        print(f"  {run:<36}{len(group):>7}{group['w_ms'].mean():>7.1f}{group['u_ms'].mean():>7.1f}"
              f"{errors[0]:>+8.1%}{errors[1]:>+8.1%}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--profile", required=True)
    p.add_argument("--model", default="qwen3-0.6b")
    args = p.parse_args(argv)
    steps = pd.concat([decode_steps(run, args.profile, args.model) for run in args.runs])
    print(f"{len(args.runs)} runs")
    for beside, group in steps.groupby("beside"):
        report(str(beside), group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
