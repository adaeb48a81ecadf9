"""The cost model against a step record on identical plans: the attribution's per-step table.

Every recorded step's shape is priced by the validation's cost model and set
against the recorded times (``sim.costs.recorded.recorded_times``: the step
time as the replay's loop asks it, strict or overlapped, and the device time
where the record has one). Grouped by step kind (pure decode, mixed, prefill
only), by batch-size band (prefill chunks + decode requests) and, for a model
with a measured grid, by reach (``within`` the profile's grid, ``beyond`` it:
priced by extrapolation, ``sim.costs.reach``; the steps beyond also per kind and
batch band), each group gives::

    n             steps
    recorded_ms   mean recorded time
    model_ms      mean modelled time
    error         sum(model) / sum(recorded) - 1: the model's error on the group's
                  total time, the share a replay of these plans would be off by
    median_ratio  median of model / recorded per step

for the step time and (``device``, steps with a recorded device time) the
device time. ``scheduler`` sets the recorded scheduler time per step
(``schedule_end - schedule_start``) against the profile's CPU cost of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from core.scheduler.shape import StepShape
from sim.costs.base import CpuCosts
from sim.costs.reach import Reach
from sim.costs.recorded import BAND_EDGES, KINDS, RecordedCostModel, band, step_kind


def _group(recorded: np.ndarray, model: np.ndarray) -> dict[str, Any]:
    keep = np.isfinite(recorded) & np.isfinite(model)
    recorded, model = recorded[keep], model[keep]
    if not len(recorded):
        return {"n": 0, "recorded_ms": None, "model_ms": None, "error": None,
                "median_ratio": None}  # fmt: skip
    total = float(recorded.sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = model / recorded
    ratios = ratios[np.isfinite(ratios)]
    return {
        "n": len(recorded),
        "recorded_ms": float(recorded.mean()) * 1e3,
        "model_ms": float(model.mean()) * 1e3,
        "error": float(model.sum()) / total - 1 if total > 0 else None,
        "median_ratio": float(np.median(ratios)) if len(ratios) else None,
    }


def _table(frame: pd.DataFrame, by: str, order: list[str]) -> dict[str, Any]:
    out = {}
    for key in order:
        rows = frame[frame[by] == key]
        if len(rows):
            out[key] = {
                "step": _group(rows["recorded_step"].to_numpy(), rows["model_step"].to_numpy()),
                "device": _group(
                    rows["recorded_device"].to_numpy(), rows["model_device"].to_numpy()
                ),
            }
    return out


def _reach(shape: StepShape, measured: Reach) -> str:
    """``beyond`` if ``shape`` exceeds ``measured`` on any feature, else ``within``."""
    step = Reach()
    step.widen(shape)
    return "beyond" if step.beyond(measured) else "within"


def step_errors(model: RecordedCostModel, record: pd.DataFrame, cpu: CpuCosts) -> dict[str, Any]:
    """The per-step table of ``record`` priced by ``model.wrapped`` (see the module docstring)."""
    batch = (record["prefill_requests"] + record["decode_requests"]).to_numpy(np.int64)
    shapes = model.shapes
    frame = pd.DataFrame(
        {
            "kind": [step_kind(s.prefill_tokens, s.decode_requests) for s in shapes],
            "batch": [band(int(n)) for n in batch],
            "recorded_step": model.step_s,
            "model_step": model.model_step_s,
            "recorded_device": record["device_ms"].to_numpy(np.float64) / 1e3,
            "model_device": model.model_device_s,
        }
    )
    bands = [band(e) for e in BAND_EDGES]
    measured = model.wrapped.measured_reach()
    by_reach: dict[str, Any] = {}
    if measured is not None:
        frame["reach"] = [_reach(s, measured) for s in shapes]
        beyond = frame[frame["reach"] == "beyond"]
        by_reach = _table(frame, "reach", ["within", "beyond"])
        for kind in KINDS:
            rows = beyond[beyond["kind"] == kind]
            by_reach |= {f"beyond, {kind} {k}": v for k, v in _table(rows, "batch", bands).items()}
    scheduler = (record["schedule_end"] - record["schedule_start"]).to_numpy(np.float64)
    modelled = np.array([cpu.schedule_time(int(n)) for n in batch])
    return {
        "model": model.wrapped.name,
        "all": _table(frame.assign(all="all"), "all", ["all"]).get("all"),
        "by_kind": _table(frame, "kind", list(KINDS)),
        "by_batch": _table(frame, "batch", bands),
        "by_reach": by_reach,
        "scheduler": _group(scheduler, modelled),
    }


def format_step_errors(steps: dict[str, Any]) -> list[str]:
    """Text rows: the model's error on the step time per kind and batch band."""
    lines = [f"  cost model ({steps['model']}) on the recorded plans: error of the summed step "
             f"time (device time)"]  # fmt: skip
    groups = [("all", steps["all"])] if steps["all"] else []
    groups += [(f"kind {k}", v) for k, v in steps["by_kind"].items()]
    groups += [(f"batch {k}", v) for k, v in steps["by_batch"].items()]
    groups += [(f"reach {k}", v) for k, v in steps.get("by_reach", {}).items()]
    for name, g in groups:
        step, device = g["step"], g["device"]
        dev = "-" if device["error"] is None else f"{device['error']:+.1%}"
        err = "-" if step["error"] is None else f"{step['error']:+.1%}"
        lines.append(f"  {name:<26}{step['n']:>8} steps {err:>9} ({dev})")
    return lines
