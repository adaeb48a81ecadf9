"""``sim capacity``: the highest rate each configuration serves within its SLOs, by bisection.

A probe replays the trace at rate scale ``x`` (arrivals divided by ``x``) and
passes when its SLO attainment (requests meeting every SLO, over all requests)
reaches ``--attainment``. Per configuration, starting at ``x = 1``:

1. bracket: double ``x`` while probes pass (up to ``MAX_SCALE``), halve it
   while they fail (down to ``MIN_SCALE``);
2. bisect geometrically (``sqrt(lo * hi)``) until ``hi / lo <= 1 + tolerance``.

The capacity is ``lo``, the highest passing scale: ``lo`` times the trace's
mean arrival rate (requests over the span of arrivals) in requests per second.
With the traffic split evenly over ``N`` replicas each sees rate scale
``1 / N``, so the trace's own rate needs ``ceil(1 / lo)`` replicas. The binding
limit (``lab.report.verdict``) is reported at ``lo`` and at ``hi``, the lowest
failing scale: the limit that binds at the edge; with it, at ``hi``, the stage
that takes the largest share of TTFT and how busy the engine is. ``crossing_scale`` is the
point estimate between probes: where the attainment falls through the target, interpolated
in the logarithm of the scale between ``lo`` and the next probed scale above it (what
``sim validate --capacity`` sets against the real engine's). Bisection assumes attainment
falls as the rate rises; all probes are listed in ``probes.csv``.

All configurations search at once: each round runs one probe per unfinished
configuration on the executor, through the same cache as ``sim sweep``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pandas as pd

from lab.sweep.executor import Executor
from lab.sweep.probes import Probe, RowCache, probe_key, run_probes
from lab.sweep.sweep import Plan
from schema.traces import Trace
from sim.config import SimConfig

MAX_SCALE = 1024.0
MIN_SCALE = 1.0 / 1024


@dataclass(slots=True)
class Bracket:
    """A bisection over the rate scale (the module docstring's steps 1 and 2): the row of
    every scale probed so far and the bracket they give. ``sim capacity`` probes with
    replays, ``sim validate --capacity`` with runs on the real engine (a row needs
    ``status``, ``slo_attainment`` and ``error``)."""

    lo: float | None = None  # highest passing scale
    hi: float | None = None  # lowest failing scale
    rows: dict[float, dict[str, Any]] = field(default_factory=dict)
    error: str = ""
    min_scale: float = MIN_SCALE  # the bracket stops halving here
    max_scale: float = MAX_SCALE  # and doubling here

    def next_scale(self, tolerance: float) -> float | None:
        """The next scale to probe, or None when the search is over."""
        lo, hi = self.lo, self.hi
        if self.error:
            return None
        if lo is None and hi is None:
            return 1.0
        if lo is None:
            return None if hi is None or hi <= self.min_scale else hi / 2
        if hi is None:
            return None if lo >= self.max_scale else lo * 2
        return None if hi / lo <= 1 + tolerance else math.sqrt(lo * hi)

    def record(self, scale: float, row: dict[str, Any], attainment: float) -> None:
        self.rows[scale] = row
        if row["status"] != "ok":
            self.error = row["error"]
        elif row["slo_attainment"] >= attainment:
            self.lo = scale if self.lo is None else max(self.lo, scale)
        else:
            self.hi = scale if self.hi is None else min(self.hi, scale)


@dataclass(slots=True)
class Search(Bracket):
    """One configuration's bisection in ``sim capacity``: its probe at rate scale 1, which
    each step copies at another scale."""

    probe: Probe = field(kw_only=True)


def probe_at(probe: Probe, scale: float, trace_digest: str, limit: int | None) -> Probe:
    """``probe`` at another rate scale (an invalid configuration keeps its failing key)."""
    if probe.error:
        return replace(probe, rate_scale=scale)
    key = probe_key(trace_digest, limit, SimConfig.from_flat(**probe.config), scale)
    return Probe(probe.config, scale, key)


def search_capacity(
    plan: Plan,
    trace: Trace,
    executor: Executor,
    cache: RowCache,
    *,
    attainment: float,
    tolerance: float,
    trace_digest: str,
    progress: bool = True,
) -> list[Search]:
    """Bisect every configuration of ``plan`` (its probes' rate scales are ignored)."""
    searches = [Search(probe=p) for p in plan.probes]

    def steps() -> list[tuple[Probe, Callable[[dict[str, Any]], None]]]:
        todo = [(s, s.next_scale(tolerance)) for s in searches]
        return [
            (
                probe_at(s.probe, x, trace_digest, trace.limit),
                partial(s.record, x, attainment=attainment),
            )
            for s, x in todo
            if x is not None
        ]

    run_rounds(steps, trace, executor, cache, progress=progress, desc="capacity")
    return searches


def run_rounds(
    steps: Callable[[], list[tuple[Probe, Callable[[dict[str, Any]], None]]]],
    trace: Trace,
    executor: Executor,
    cache: RowCache,
    *,
    progress: bool,
    desc: str,
) -> None:
    """Run ``steps()``'s probes a round at a time, each row to its callback, until none is left."""
    for round_no in range(1, 1000):
        todo = steps()
        if not todo:
            break
        rows = run_probes(
            [p for p, _ in todo], trace, executor, cache, progress=progress,
            desc=f"{desc} round {round_no}",
        )  # fmt: skip
        for (_, record), row in zip(todo, rows, strict=True):
            record(row)


def arrival_rate(trace: Trace) -> float:
    """Mean arrival rate of the trace (requests per second of arrivals)."""
    span = trace.duration_s
    return len(trace.requests) / span if span > 0 else math.inf


def crossing(mean: dict[float, float], attainment: float) -> float | None:
    """Where ``mean`` (scale -> attainment) falls through ``attainment``: interpolated in the
    logarithm of the scale between the highest scale that reaches it and the next probed
    scale above; None when no scale reaches it, the last scale when none falls below it."""
    scales = sorted(mean)
    reached = [x for x in scales if mean[x] >= attainment]
    if not reached:
        return None
    lo = max(reached)
    above = [x for x in scales if x > lo]
    if not above:
        return lo
    hi = above[0]
    a, b = mean[lo], mean[hi]
    share = (a - attainment) / (a - b)
    return float(math.exp(math.log(lo) + share * (math.log(hi) - math.log(lo))))


def capacity_table(
    plan: Plan, searches: list[Search], knobs: list[str], rate: float, attainment: float
) -> pd.DataFrame:
    """One row per configuration: its knobs, capacity, replicas and the limits at the edge."""
    records = []
    for i, (point, s) in enumerate(zip(plan.points, searches, strict=True)):
        at, above = s.rows.get(s.lo or -1.0, {}), s.rows.get(s.hi or -1.0, {})
        servers = _servers(s.probe.config)
        records.append(
            {
                "config_id": i,
                **{k: point.get(k) for k in knobs},
                "status": "failed" if s.error else "ok",
                "max_rate_scale": s.lo if s.lo is not None else 0.0,
                "max_request_rate": (s.lo or 0.0) * rate,
                "servers": servers,
                "max_request_rate_per_server": (s.lo or 0.0) * rate / servers,
                "replicas_even_split": math.ceil(1 / s.lo) if s.lo else None,
                "attainment_at_max": at.get("slo_attainment"),
                "binding_limit_at_max": at.get("binding_limit"),
                "first_failing_scale": s.hi,
                "crossing_scale": crossing(
                    {x: r["slo_attainment"] for x, r in s.rows.items() if not r.get("error")},
                    attainment,
                ),
                "attainment_above": above.get("slo_attainment"),
                "binding_limit_above": above.get("binding_limit"),
                "ttft_stage_above": above.get("dominant_ttft_stage"),
                "engine_busy_above": above.get("engine_busy"),
                "ttft_ms_p90_at_max": at.get("ttft_ms_p90"),
                "tpot_ms_p90_at_max": at.get("tpot_ms_p90"),
                "output_throughput_at_max": at.get("output_throughput"),
                "probes": len(s.rows),
                "error": s.error,
            }
        )
    return pd.DataFrame.from_records(records)


def _servers(config: dict[str, Any]) -> int:
    """The servers (GPUs, one each) of a probe's configuration: its replicas, or its prefill
    and decode replicas."""
    disaggregated = int(config.get("prefill_replicas") or 0) + int(
        config.get("decode_replicas") or 0
    )
    return disaggregated or int(config.get("replicas") or 1)


def probes_table(
    rows: list[dict[Any, dict[str, Any]]], attainment: float, column: str = "rate_scale"
) -> pd.DataFrame:
    """Every probe of every search (``rows``: each configuration's rows by the value of
    ``column`` searched): configuration, that value, pass or fail, its row."""
    records = [
        {"config_id": i, column: x, "passed": _passed(row, attainment), **row}
        for i, by_x in enumerate(rows)
        for x, row in sorted(by_x.items())
    ]
    return pd.DataFrame.from_records(records).drop(columns=["wall_s"], errors="ignore")


def _passed(row: dict[str, Any], attainment: float) -> bool:
    return bool(row["status"] == "ok" and row["slo_attainment"] >= attainment)
