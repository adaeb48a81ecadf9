"""``sim sweep``: replay a trace under every configuration of a grid; one row per configuration.

Outputs in ``--out DIR``: ``sweep.csv`` and ``sweep.parquet`` (``config_id``,
the grid's knobs, the summary metrics, goodput and SLO attainment under the
given SLOs, the binding limit, ``pareto_ttft`` / ``pareto_tpot``, ``status``,
``error``, ``key``), ``sweep.html`` (the Pareto fronts and each knob's effect),
and ``cache/`` (one file per finished configuration, so a rerun resumes).

A configuration is on the TTFT Pareto front when no other configuration has
both a higher output throughput and a lower P90 TTFT (likewise for TPOT).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab.sweep.grid import CLUSTER, RATE_SCALE, cluster_fields, expand
from lab.sweep.probes import METRIC_COLUMNS, Probe, file_digest, probe_key
from schema.tables import write_csv, write_parquet
from sim.config import build_config

THROUGHPUT = "output_throughput"
FRONTS = {"pareto_ttft": "ttft_ms_p90", "pareto_tpot": "tpot_ms_p90"}
"""Pareto flag column -> the latency it trades against throughput."""
EFFECT_METRICS = (THROUGHPUT, "goodput", "ttft_ms_p90", "tpot_ms_p90")
COLUMNS = (*METRIC_COLUMNS, "status", "error", "key")
"""Columns of a configuration's row after its knobs."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The configurations of a grid: their knob values and the probes that replay them."""

    points: list[dict[str, Any]]
    probes: list[Probe]


def plan_grid(
    grid: dict[str, list[Any]],
    trace_path: Path,
    limit: int | None,
    config_file: Path | None,
    overrides: dict[str, Any],
) -> Plan:
    """One probe per grid point: defaults, then ``config_file``, ``overrides``, the point's knobs.

    A point that makes no valid configuration still gets a probe, which fails
    with the configuration's error when it runs.
    """
    digest = file_digest(trace_path)
    points, probes = expand(grid), []
    for point in points:
        knobs = {k: v for k, v in point.items() if k not in (RATE_SCALE, CLUSTER)}
        scale = float(point.get(RATE_SCALE, 1.0))
        fields = {**overrides, **knobs}
        try:
            if CLUSTER in point:
                fields |= cluster_fields(point[CLUSTER])
            config = build_config(config_file, **fields)
            values = config.to_dict()
        except (TypeError, ValueError) as exc:
            key = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
            error = f"invalid configuration: {type(exc).__name__}: {exc}"
            probes.append(Probe(fields, scale, "invalid-" + key.hexdigest()[:12], error))
            continue
        values.pop("resolved_num_pages")
        probes.append(Probe(values, scale, probe_key(digest, limit, config, scale)))
    return Plan(points, probes)


def pareto_front(throughput: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """Points that no other point beats on both (higher throughput and lower latency)."""
    ok = np.isfinite(throughput) & np.isfinite(latency)
    front = np.zeros(len(throughput), dtype=bool)
    for i in np.flatnonzero(ok):
        better = ok & (throughput >= throughput[i]) & (latency <= latency[i])
        better &= (throughput > throughput[i]) | (latency < latency[i])
        front[i] = not better.any()
    return front


def sweep_table(plan: Plan, rows: list[dict[str, Any]], knobs: list[str]) -> pd.DataFrame:
    """One row per configuration, in grid order (the columns of the module docstring)."""
    records = [
        {"config_id": i, **{k: point.get(k) for k in knobs}, **{c: row.get(c) for c in COLUMNS}}
        for i, (point, row) in enumerate(zip(plan.points, rows, strict=True))
    ]
    table = pd.DataFrame.from_records(records, columns=["config_id", *knobs, *COLUMNS])
    for flag, latency in FRONTS.items():
        table[flag] = pareto_front(_floats(table[THROUGHPUT]), _floats(table[latency]))
    return table


def _floats(column: pd.Series) -> np.ndarray:
    values: np.ndarray = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)
    return values


def knob_effects(table: pd.DataFrame, knobs: list[str]) -> pd.DataFrame:
    """For each swept knob and value: the median of ``EFFECT_METRICS`` over the successful
    configurations with that value (the knob's main effect), and how many there were."""
    ok = table[table["status"] == "ok"]
    parts = []
    for knob in knobs:
        values = ok[knob].astype(str)
        grouped = ok.assign(value=values).groupby("value", sort=False)
        medians = grouped[list(EFFECT_METRICS)].median().reset_index()
        medians.insert(0, "knob", knob)
        medians["configs"] = grouped.size().to_numpy()
        parts.append(medians)
    if not parts:
        return pd.DataFrame(columns=["knob", "value", *EFFECT_METRICS, "configs"])
    return pd.concat(parts, ignore_index=True)


def write_sweep(out: Path, table: pd.DataFrame) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_csv(table, out / "sweep.csv")
    write_parquet(table, out / "sweep.parquet")
