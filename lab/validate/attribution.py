"""Where the simulator's error comes from: ``attribution.json`` of ``sim validate``.

For each real run with a step record (``engine_steps.csv``), three simulations
of the same requests with the same scheduler settings:

    C  the validation's simulation: modelled steps, modelled CPU stages
    B  recorded steps (``sim.costs.recorded``: the run's step times on the steps
       whose shape it recorded, the model corrected by the record on the
       others), modelled CPU stages
    A  recorded steps and the run's recorded CPU stages
       (``sim.model.recorded_stages``: each request sent when the run sent
       it, reaching the scheduler when the run's stamps say, its tokens taking
       the run's way out to the client)

and for every compared metric (TTFT, TPOT, E2E at P50/P90/P99, the request and
output throughputs)::

    error = C - real
          = (C - B)     step-time model        what pricing steps by the model costs
          + (B - A)     CPU and IPC stages     what modelling the stages around the
                                               scheduler costs
          + (A - real)  scheduling divergence  what is left with both recorded: the
                                               simulated scheduler's other plans
                                               (other batches, other timing), the
                                               scheduler's own CPU time (priced by the
                                               profile in all three), the loop's gaps

each part absolute and as a share of ``real``. The sum telescopes, so the parts
add up to the total exactly (to float rounding) for every metric and run. The
order is a choice: swapping steps and stages (C -> stages recorded -> both)
would split the same total differently where the two interact (queueing makes
them interact), so a part reads "the error removed by recording this, once the
parts before it are recorded".

Beside it, per run: the cost model against the recorded steps on identical
plans (``lab.validate.step_errors``), and how many of A's steps matched a
recorded step (``plans``): a replay that forms the plans the engine formed
matches nearly all of them; a low share is the divergence in plans itself.

A server of several replicas (``engine serve --dp N --record-steps``) records a
table with a ``replica`` column. B and A replay one server, so there the
attribution is the cost model against each replica's recorded plans
(``replicas``, the same table per replica): where replicas share a device, it
says how much slower their steps ran than the profile of one replica alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from lab.validate.compare import THROUGHPUTS
from lab.validate.step_errors import format_step_errors, step_errors
from schema.steprecord import (
    REPLICA_COLUMN,
    STEP_RECORD_NAME,
    read_step_record,
    step_record_in,
)
from schema.traces import Trace
from sim.config import SimConfig
from sim.costs.base import CpuCosts, GpuCostModel
from sim.costs.recorded import RecordedCostModel
from sim.model.recorded_stages import RecordedStages, at_send_times
from sim.replay import build_costs, run_replay

ATTRIBUTION_NAME = "attribution.json"
METRICS = (
    *(f"{m}.{q}" for m in ("ttft_ms", "tpot_ms", "e2e_ms") for q in ("p50", "p90", "p99")),
    *THROUGHPUTS,
)
PARTS = ("step_time_model", "cpu_stages", "scheduling_divergence")
ORDER = (
    "error = C - real = (C - B) step_time_model + (B - A) cpu_stages + (A - real) "
    "scheduling_divergence; C: modelled steps and stages, B: recorded steps, A: recorded "
    "steps and stages. The sum telescopes (the parts add up to the total exactly); the order "
    "is a choice: another order splits the same total differently where the parts interact."
)


@dataclass(frozen=True, slots=True)
class RealRun:
    """One real run: its name (``real-1``), requests table, summary and step record."""

    name: str
    requests: pd.DataFrame
    summary: dict[str, Any]
    record: pd.DataFrame


def value(summary: dict[str, Any], key: str) -> float | None:
    """A metric of a summary at a dotted key (``ttft_ms.p50``)."""
    node: Any = summary
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return None if node is None else float(node)


def decompose(
    real: float | None, c: float | None, b: float | None, a: float | None
) -> dict[str, Any]:
    """``C - real`` and its three parts, absolute and as a share of ``real`` (None where a
    value is missing, or real is 0 for the shares)."""
    out: dict[str, Any] = {"real": real, "C": c, "B": b, "A": a}
    if None in (real, c, b, a):
        return out | {"total": None, "parts": dict.fromkeys(PARTS)}
    assert real is not None and c is not None and b is not None and a is not None
    parts = dict(zip(PARTS, (c - b, b - a, a - real), strict=True))

    def share(x: float) -> float | None:
        return x / real if real else None

    out["total"] = {"abs": c - real, "rel": share(c - real)}
    out["parts"] = {p: {"abs": x, "rel": share(x)} for p, x in parts.items()}
    return out


def simulate_b_and_a(
    trace: Trace, config: SimConfig, run: RealRun, costs: tuple[GpuCostModel, CpuCosts]
) -> tuple[dict[str, Any], dict[str, Any], RecordedCostModel, RecordedCostModel]:
    """B and A of ``run``: their summaries and recorded cost models (one step at a time, as
    the recorded model prices them)."""
    gpu, cpu = costs
    stepwise = replace(config, fast_forward=False)
    b_model = RecordedCostModel(run.record, gpu, config.overlap)
    b = run_replay(trace, stepwise, progress=False, costs=(b_model, cpu))
    a_trace = at_send_times(trace, run.requests)
    stages = RecordedStages.of_run(run.requests, a_trace.requests)
    a_model = RecordedCostModel(run.record, gpu, config.overlap)
    a = run_replay(a_trace, stepwise, progress=False, costs=(a_model, cpu), stages=stages)
    b.summary["recorded_stages"] = None
    a.summary["recorded_stages"] = stages.counts()
    return b.summary, a.summary, b_model, a_model


def attribute_run(
    trace: Trace, config: SimConfig, c_summary: dict[str, Any], run: RealRun
) -> dict[str, Any]:
    """The attribution of one real run (see the module docstring)."""
    costs = build_costs(config)
    b, a, b_model, a_model = simulate_b_and_a(trace, config, run, costs)
    metrics = {
        key: decompose(value(run.summary, key), value(c_summary, key), value(b, key), value(a, key))
        for key in METRICS
    }
    a_steps = a_model.matched + a_model.unmatched
    plans = {
        "recorded_steps": len(run.record),
        "B": {"matched": b_model.matched, "unmatched": b_model.unmatched},
        "A": {"matched": a_model.matched, "unmatched": a_model.unmatched},
        "A_matched_share": a_model.matched / a_steps if a_steps else None,
    }
    return {
        "metrics": metrics,
        "plans": plans,
        "stages": a["recorded_stages"],
        "steps": step_errors(a_model, run.record, costs[1]),
    }


def replica_steps(config: SimConfig, run: RealRun) -> dict[str, Any]:
    """The cost model against each replica's recorded plans in ``run``."""
    gpu, cpu = build_costs(config)
    out = {}
    for k in range(config.replicas):
        mine = run.record[REPLICA_COLUMN] == k
        record = run.record[mine].drop(columns=REPLICA_COLUMN).reset_index(drop=True)
        if len(record):
            out[str(k)] = step_errors(RecordedCostModel(record, gpu, config.overlap), record, cpu)
    return {"recorded_steps": len(run.record), "replicas": out}


def attribute(
    trace: Trace,
    config: SimConfig,
    c_summary: dict[str, Any],
    folders: list[Path],
    requests: list[pd.DataFrame],
    summaries: list[dict[str, Any]],
) -> dict[str, Any]:
    """``attribution.json``: the attribution of each real run (its folder, requests table and
    summary) whose folder holds a step record, and how to read it; a ``note`` names the runs
    without one (and is all there is when none has one)."""
    records = [step_record_in(f) for f in folders]
    runs = [
        RealRun(f.name, r, s, read_step_record(path))
        for f, r, s, path in zip(folders, requests, summaries, records, strict=True)
        if path is not None
    ]
    lacking = [f.name for f, path in zip(folders, records, strict=True) if path is None]
    missing = f"{', '.join(lacking)} hold(s) no {STEP_RECORD_NAME}"
    if not runs:
        return {"note": f"no error attribution: {missing} (record the server's steps: "
                        "engine serve --record-steps, engine bench --server-steps)"}  # fmt: skip
    several = [r.name for r in runs if REPLICA_COLUMN in r.record.columns]
    if several != ([r.name for r in runs] if config.replicas > 1 else []):
        raise ValueError(
            f"the step records of {', '.join(r.name for r in runs)} do not match the "
            f"simulation's {config.replicas} replica(s): a record of several replicas has a "
            f"{REPLICA_COLUMN!r} column"
        )
    if config.replicas > 1:
        note = (f"{config.replicas} replicas: the cost model on each replica's recorded plans "
                "(the three-part split replays one server)")  # fmt: skip
        if lacking:
            note += f"; {missing}"
        return {"note": note, "runs": {r.name: replica_steps(config, r) for r in runs}}
    out: dict[str, Any] = {
        "order": ORDER,
        "parts": list(PARTS),
        "metrics": list(METRICS),
        "runs": {r.name: attribute_run(trace, config, c_summary, r) for r in runs},
    }
    if lacking:
        out["note"] = f"attributed {len(runs)} of {len(folders)} real runs: {missing}"
    return out


def format_attribution(attribution: dict[str, Any]) -> str:
    """Per run, a table: real, the error C - real and its three parts, each as % of real;
    the note on runs without a step record."""
    if "runs" not in attribution:
        return str(attribution["note"])
    head = f"{'metric':<20}{'real':>11}{'error':>9}{'steps':>9}{'stages':>9}{'diverg.':>9}"
    lines = []
    for name, run in attribution["runs"].items():
        if "replicas" in run:
            for k, steps in run["replicas"].items():
                lines += [f"{name}, replica {k}:", *format_step_errors(steps)]
            continue
        if not lines:
            lines.append("error attribution (% of real): C - real = steps (C-B) + stages (B-A) "
                         "+ divergence (A-real)")  # fmt: skip
        plans = run["plans"]
        share = plans["A_matched_share"]
        lines += [
            f"{name}: {plans['A']['matched']} of A's "
            f"{plans['A']['matched'] + plans['A']['unmatched']} steps matched a recorded step "
            f"({'-' if share is None else f'{share:.0%}'}; {plans['recorded_steps']} recorded)",
            head,
        ]
        for key, e in run["metrics"].items():
            cells = [e["total"], *(e["parts"][p] for p in PARTS)]
            text = "".join(f"{_pct(c):>9}" for c in cells)
            real = "-" if e["real"] is None else f"{e['real']:,.2f}"
            lines.append(f"{key:<20}{real:>11}{text}")
        lines += format_step_errors(run["steps"])
    if attribution.get("note"):
        lines.append(attribution["note"])
    return "\n".join(lines)


def _pct(cell: dict[str, Any] | None) -> str:
    if cell is None or cell["rel"] is None:
        return "-"
    return f"{cell['rel']:+.1%}"
