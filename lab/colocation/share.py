"""Does a co-located decode step's time depend on the size of the steps beside it? Two fits.

Each RUN_DIR holds the step records of two replicas that shared a GPU
(steps.replica0.csv.gz and steps.replica1.csv.gz). For every decode step that
ran beside the other replica's steps of one kind (decode or prefill, as
sim.costs.colocation assigns it), with w its modelled time alone and u the
modelled time alone of the other replica's steps of that kind beside it (their
mean, weighted by overlap), the recorded device time is fitted per pair of kinds
over all runs as

    line:   t = stretch * w + fixed       (the co-location table's form)
    size:   t = a * w + b * u + c         (the neighbour's size counts)

and printed with the root mean square residual and, per run and replica, the
error of the summed time: what a table of that form would get wrong on the
plans that ran.

u is the neighbours' size, not their work done during the step: that work is
their speed times the step's own duration, so a fit on it explains the duration
by itself (and would, for any data).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from lab.tools import add_tool
from schema.steprecord import read_step_record
from sim.config import build_config
from sim.costs.colocation import KINDS, covered, gpu_intervals, kind_of, timed_steps
from sim.costs.recorded import RecordedCostModel
from sim.replay import build_costs

FORMS = ("line", "size")
RECORDS = ("steps.replica0.csv.gz", "steps.replica1.csv.gz")
HELP = "does a co-located decode step depend on its neighbours' size? two fits"
EXAMPLE = """example:
  sim colocation share RUN_DIR [RUN_DIR ...] --profile PROFILE.csv --model qwen3-0.6b"""


def read_run(run: Path) -> list[pd.DataFrame]:
    """The two replicas' timed steps of ``run``."""
    missing = [name for name in RECORDS if not (run / name).is_file()]
    if missing:
        raise ValueError(f"{run} holds no {' or '.join(missing)}")
    return [timed_steps(read_step_record(run / name)) for name in RECORDS]


def decode_steps(run: Path, profile: str, model: str) -> pd.DataFrame:
    """The run's decode steps beside the other replica's steps: the kind beside, recorded,
    w and u (ms)."""
    config = build_config(None, model=model, profile=profile, overlap=True)
    gpu, _ = build_costs(config)
    records = read_run(run)
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
    """The fit's design matrix: w and a constant (line), or w, u and a constant (size)."""
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
    """Print both fits of the decode steps beside ``beside`` steps, and their error per run."""
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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim colocation share``: its flags and its handler."""
    p = add_tool(sub, "share", help=HELP, doc=__doc__, example=EXAMPLE)
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR",
                   help="a folder with the two replicas' step records")  # fmt: skip
    p.add_argument("--profile", required=True, help="the model's profile, measured alone")
    p.add_argument("--model", default="qwen3-0.6b", help="the model preset (qwen3-0.6b)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        steps = pd.concat([decode_steps(run, args.profile, args.model) for run in args.runs])
    except (OSError, ValueError) as exc:
        print(f"sim colocation share: error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(args.runs)} runs")
    for beside, group in steps.groupby("beside"):
        report(str(beside), group)
    return 0
