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
from schema.traces import Trace
from sim.config import SimConfig
from sim.model.replica import Replica

REPLICA_PERCENTILES = ("p50", "p90", "p99")


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
    """Per replica: requests placed on it, completed, rejected, throughput, TTFT and TPOT
    P50/P90/P99, its prefix hit rate, and its busy share (its steps' time, ``busy_s``, over
    the run's duration)."""
    out = []
    by_replica = requests["replica"].to_numpy()
    for k, (st, busy) in enumerate(zip(stats, busy_s, strict=True)):
        mine = requests[by_replica == k]
        done = mine[mine["status"] == "completed"]
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
                "ttft_ms": _percentiles(done["ttft_ms"].to_numpy()),
                "tpot_ms": _percentiles(done["tpot_ms"].to_numpy()),
                "prefix_hit_rate": st.prefix_hit_rate,
                "busy_share": busy / duration_s if duration_s > 0 else 0.0,
            }
        )
    return out


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    """P50, P90 and P99 of the finite ``values`` (None each when there are none)."""
    finite = WeightedSamples.of(values).finite()
    if not finite.size:
        return dict.fromkeys(REPLICA_PERCENTILES)
    points = finite.percentile([int(name[1:]) for name in REPLICA_PERCENTILES])
    return {name: float(x) for name, x in zip(REPLICA_PERCENTILES, points, strict=True)}


def router_summary(router: Router, warning: str | None = None) -> dict[str, Any]:
    """The policy, its decisions by reason, what is still open (0 after a full replay), and
    the warning of ``routing_warning`` (None: none)."""
    return {
        "policy": router.config.policy,
        "load": router.config.load,
        "decisions": dict(sorted(router.decisions.items())),
        "outstanding": router.outstanding,
        "warning": warning,
    }


def routing_warning(trace: Trace, config: SimConfig) -> str | None:
    """What the router of a cluster cannot read in ``trace``, and what it does instead: a
    trace without ``hash_ids`` gives ``cache_aware`` no prefix to match, and a simulated
    request carries no session for ``session_sticky``. None where nothing is missing."""
    if config.num_replicas < 2:
        return None
    policy = config.router.policy
    if policy == "cache_aware" and not any(r.hash_ids for r in trace.requests):
        return (
            f"{trace.path} has no hash_ids (prompt block hashes), so cache_aware has no prefix "
            "to match: it routes every request to the least loaded replica (decision "
            "least_loaded), as --router least_outstanding would"
        )
    if policy == "session_sticky":
        return (
            "a trace carries no sessions, so session_sticky routes every request to the least "
            "loaded replica (decision no_session)"
        )
    return None


def queue_frame(replicas: list[Replica]) -> pd.DataFrame:
    """Queue length per stage at each change, in time order (stable within a time); for
    several replicas, each replica's in turn with its number in ``replica``."""
    frames = [_queues_of(r) for r in replicas]
    if len(frames) == 1:
        return frames[0]
    for k, f in enumerate(frames):
        f["replica"] = np.int64(k)
    return pd.concat(frames, ignore_index=True)


def _queues_of(p: Replica) -> pd.DataFrame:
    parts = [p.front_queue_samples("frontend"), p.front_queue_samples("tokenizer")]
    parts.append(
        (
            np.asarray([t for t, _, _ in p.queue_samples], dtype=np.float64),
            np.asarray([n for _, _, n in p.queue_samples], dtype=np.int64),
        )
    )
    parts.append(p.detokenizer_queue())
    names = ("frontend", "tokenizer", "scheduler", "detokenizer")
    frame = pd.DataFrame(
        {
            "time": np.concatenate([t for t, _ in parts]),
            "stage": np.repeat(names, [len(t) for t, _ in parts]),
            "queue_len": np.concatenate([n for _, n in parts]).astype(np.int64),
        }
    )
    return frame.sort_values("time", kind="stable").reset_index(drop=True)
