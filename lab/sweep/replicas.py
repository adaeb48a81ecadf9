"""``sim capacity --replicas-search``: the fewest replicas that meet the SLOs, by simulating them.

A probe replays the trace at one rate scale (1, or ``--rate-scale``) on a
cluster of ``n`` replicas behind the router (``SimConfig(replicas=n,
router=...)``) and passes when its SLO attainment reaches ``--attainment``.
Per configuration the search starts from the even-split estimate
``ceil(scale / capacity scale)`` and gallops (steps of 1, 2, 4, ... replicas)
up while probes fail or down while they pass, then bisects until ``n`` passes
and ``n - 1`` fails (or ``n`` is 1). It assumes more replicas never serve
worse. The SLOs are "not met at any replica count" when ``--max-replicas``
fails, or when the rate-scale search already failed at its lowest scale
(``MIN_SCALE``: each request as good as alone on one replica), which no
number of replicas improves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pandas as pd

from lab.sweep.capacity import MIN_SCALE, Search, run_rounds
from lab.sweep.executor import Executor
from lab.sweep.probes import Probe, RowCache, probe_key
from schema.traces import Trace
from sim.config import SimConfig


@dataclass(slots=True)
class ReplicaSearch:
    """One configuration's search over the number of replicas."""

    config: dict[str, Any]  # the configuration's flat fields, without ``replicas``
    start: int
    max_replicas: int
    passed: int | None = None  # fewest replicas that passed
    failed: int = 0  # most replicas that failed (0: none yet)
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    error: str = ""
    not_met: str = ""  # why no replica count meets the SLOs

    def next_n(self) -> int | None:
        """The next number of replicas to probe, or None when the search is over."""
        p, f, k = self.passed, self.failed, len(self.rows)
        if self.error or self.not_met:
            return None
        if not k:
            return self.start
        if p is None:  # only failures: gallop up
            return min(self.max_replicas, f + (1 << (k - 1)))
        if p - f <= 1:
            return None
        return max(1, p - (1 << (k - 1))) if f == 0 else (p + f) // 2

    def record(self, n: int, row: dict[str, Any], attainment: float) -> None:
        self.rows[n] = row
        self.error = "" if row["status"] == "ok" else row["error"]
        if not self.error and row["slo_attainment"] >= attainment:
            self.passed = min(n, self.passed or n)
            return
        self.failed = max(self.failed, n)  # an error ends the search anyway
        if n >= self.max_replicas and not self.error:
            self.not_met = f"not met at any replica count up to {n}: {_misses(row)}"


def _misses(row: dict[str, Any]) -> str:
    ttft, tpot = (
        float(row[k] if row[k] is not None else "nan") for k in ("ttft_ms_p99", "tpot_ms_p99")
    )
    return (
        f"attainment {row['slo_attainment']:.3f}, TTFT P99 {ttft:.1f} ms, "
        f"TPOT P99 {tpot:.1f} ms, binding limit {row['binding_limit']}"
    )


def search_replicas(
    searches: list[Search],
    trace: Trace,
    executor: Executor,
    cache: RowCache,
    *,
    rate_scale: float,
    max_replicas: int,
    router: str | None,
    attainment: float,
    trace_digest: str,
    progress: bool = True,
) -> list[ReplicaSearch]:
    """Search the replicas of every configuration whose rate-scale search is done."""
    out = []
    for s in searches:
        config = {**s.probe.config} | ({"router": router} if router else {})
        start = math.ceil(rate_scale / s.lo) if s.lo else 1
        r = ReplicaSearch(config, min(max(start, 1), max_replicas), max_replicas)
        r.error = s.error
        if s.lo is None and s.hi is not None and not s.error:
            r.not_met = (
                "not met at any replica count: one replica misses at "
                f"1/{1 / MIN_SCALE:g} of the rate, each request as good as alone "
                f"({_misses(s.rows[s.hi])})"
            )
        out.append(r)

    def probe(r: ReplicaSearch, n: int) -> Probe:
        config = {**r.config, "replicas": n}
        sim_config = SimConfig.from_flat(**config)
        return Probe(
            config, rate_scale, probe_key(trace_digest, trace.limit, sim_config, rate_scale)
        )

    def steps() -> list[tuple[Probe, Callable[[dict[str, Any]], None]]]:
        todo = [(r, r.next_n()) for r in out]
        return [
            (probe(r, n), partial(r.record, n, attainment=attainment))
            for r, n in todo
            if n is not None
        ]

    run_rounds(steps, trace, executor, cache, progress=progress, desc="replicas")
    return out


def replicas_table(searches: list[ReplicaSearch], rate_scale: float) -> pd.DataFrame:
    """Per configuration: the replicas the simulated cluster needs, with the evidence."""
    records = []
    for i, r in enumerate(searches):
        below = r.rows.get((r.passed or 0) - 1, {})
        records.append(
            {
                "config_id": i,
                "replicas_simulated": None if r.not_met or r.error else r.passed,
                "replicas_simulated_rate_scale": rate_scale,
                "attainment_at_replicas": r.rows.get(r.passed or 0, {}).get("slo_attainment"),
                "attainment_one_fewer": below.get("slo_attainment"),
                "replicas_simulated_note": r.not_met or r.error,
                "replica_probes": len(r.rows),
            }
        )
    return pd.DataFrame.from_records(records)
