"""The replicas of a run side by side: per-replica tables and summaries, the router's decisions.

One replica's tables are the pipeline's own. For several, ``steps.csv`` and
``queues.csv`` hold each replica's rows in turn (its steps in step order, its
queue samples in time order) with its number in a last column ``replica``;
``requests.csv`` always has ``replica`` (0 for one).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from core.router import Router
from core.scheduler import SchedulerStats
from schema.samples import WeightedSamples
from schema.steplog import STEP_COLUMNS, STEP_DTYPES
from schema.tables import MemoryTable
from sim.model.replica import Replica


def step_frame(tables: list[MemoryTable]) -> pd.DataFrame:
    """The replicas' step tables kept in memory (none kept: an empty table)."""
    frames = [t.frame() for t in tables]
    if not frames:
        return pd.DataFrame({c: np.zeros(0, STEP_DTYPES[c]) for c in STEP_COLUMNS})
    if len(frames) == 1:
        return frames[0]
    for k, f in enumerate(frames):
        f["replica"] = np.int64(k)
    return pd.concat(frames, ignore_index=True)


def step_record_frame(replicas: list[Replica]) -> pd.DataFrame:
    """``engine_steps.csv``: each replica's step record (``replica`` column for several)."""
    frames = []
    for r in replicas:
        if r.loop.record is None:
            raise RuntimeError("the replay kept no step record")
        frames.append(r.loop.record.frame())
    if len(frames) == 1:
        return frames[0]
    for k, f in enumerate(frames):
        f["replica"] = np.int64(k)
    return pd.concat(frames, ignore_index=True)


def replica_summaries(
    requests: pd.DataFrame, busy_s: list[float], stats: list[SchedulerStats], duration_s: float
) -> list[dict[str, Any]]:
    """Per replica: requests placed on it, completed, rejected, throughput, TTFT P50/P90, its
    prefix hit rate, and its busy share (its steps' time, ``busy_s``, over the run's
    duration)."""
    out = []
    by_replica = requests["replica"].to_numpy()
    for k, (st, busy) in enumerate(zip(stats, busy_s, strict=True)):
        mine = requests[by_replica == k]
        done = mine[mine["status"] == "completed"]
        ttft = WeightedSamples.of(done["ttft_ms"].to_numpy()).finite()
        p50, p90 = (float(x) for x in ttft.percentile([50, 90])) if ttft.size else (None, None)
        out.append(
            {
                "replica": k,
                "requests": len(mine),
                "completed": len(done),
                "rejected": int((mine["status"] == "rejected").sum()),
                "request_throughput": len(done) / duration_s if duration_s > 0 else 0.0,
                "output_throughput": (
                    float(done["output_tokens"].sum()) / duration_s if duration_s > 0 else 0.0
                ),
                "ttft_ms": {"p50": p50, "p90": p90},
                "prefix_hit_rate": st.prefix_hit_rate,
                "busy_share": busy / duration_s if duration_s > 0 else 0.0,
            }
        )
    return out


def router_summary(router: Router) -> dict[str, Any]:
    """The policy, its decisions by reason, and what is still open (0 after a full replay)."""
    return {
        "policy": router.config.policy,
        "load": router.config.load,
        "decisions": dict(sorted(router.decisions.items())),
        "outstanding": router.outstanding,
    }
