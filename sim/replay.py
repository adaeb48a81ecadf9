"""A replay: a trace through the simulated pipeline, as the frames and summary of a run."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from core.router import Router
from core.scheduler import Scheduler, SchedulerStats
from schema.jsonsafe import json_safe
from schema.metrics import REQUEST_COLUMNS, SERVER_TOKEN_COLUMNS, TIME_COLUMNS, summarize
from schema.run import RunResult
from schema.traces import Trace
from sim.config import SimConfig
from sim.costs import load_cpu_costs, make_cost_model, read_profile
from sim.costs.base import CpuCosts, GpuCostModel
from sim.costs.copies import CopyCosts, copy_costs
from sim.costs.presets import hardware
from sim.model.calls import RecordingScheduler
from sim.model.cluster import Cluster
from sim.model.pipeline import Pipeline
from sim.model.recorded_stages import RecordedStages
from sim.model.replica import Progress, Replica, RequestRecords
from sim.model.scheduler_loop import LoopSettings
from sim.replicas import (
    itl_samples,
    replica_summaries,
    router_summary,
    step_frame,
    step_record_frame,
    sum_over,
)

PROGRESS_MIN_REQUESTS = 1000


@dataclass(slots=True)
class ReplayResult(RunResult):
    """A simulated run, the scheduler (or ``RecordingScheduler``) that was driven (a list of
    them, one per replica, for several), the router of a cluster, and the step record
    (``engine_steps.csv``) where it was kept."""

    scheduler: Any = None
    router: Router | None = None
    engine_steps: pd.DataFrame | None = None  # the step record, where it was kept


class _Bar(Progress):
    def __init__(self, total: int) -> None:
        self.bar = tqdm(total=total, unit="req", file=sys.stderr, desc="replay", mininterval=0.5)

    def update(self, n: int) -> None:
        self.bar.update(n)


def build_costs(config: SimConfig) -> tuple[GpuCostModel, CpuCosts]:
    profile = read_profile(config.profile) if config.profile else None
    gpu = make_cost_model(config.cost_model, config.cost_spec(profile))
    if config.cpu_profile:
        cpu = load_cpu_costs(profile, default=config.cpu_profile)
    else:
        cpu = load_cpu_costs(profile)
    return gpu, cpu


def build_copy_costs(config: SimConfig) -> CopyCosts | None:
    """The prices of the host tier's copies; None without a host tier."""
    if not config.scheduler_config().host_pages:
        return None
    profile = read_profile(config.profile) if config.profile else None
    return copy_costs(profile, hardware(config.hardware), config.kv_bytes_per_token_per_gpu())


def host_kv_summary(stats: list[SchedulerStats], copies: CopyCosts | None) -> dict[str, Any]:
    """The host KV tier's counters over the replicas, and what priced its copies."""
    if copies is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "host_pages": sum(st.host_pages for st in stats),
        "host_hit_tokens": sum(st.host_hit_tokens for st in stats),
        "host_loaded_tokens": sum(st.host_loaded_tokens for st in stats),
        "host_written_tokens": sum(st.host_written_tokens for st in stats),
        "copy_costs": copies.describe(),
    }


def run_replay(
    trace: Trace,
    config: SimConfig,
    *,
    record_calls: bool = False,
    progress: bool = True,
    cluster: bool | None = None,
    record_steps: bool = False,
    costs: tuple[GpuCostModel, CpuCosts] | None = None,
    stages: RecordedStages | None = None,
) -> ReplayResult:
    """Simulate ``trace`` under ``config``; deterministic for the same inputs.

    ``config.replicas`` > 1 runs the cluster (``sim.model.cluster``); ``cluster=True`` runs
    it for one replica too (the tests compare it with the single pipeline).
    ``record_steps`` keeps the step record (``engine_steps``, ``sim.model.step_record``);
    ``costs`` replaces the config's cost models (a validation's recorded steps,
    ``sim.costs.recorded``), ``stages`` the modelled stages around the scheduler of the
    single pipeline (``sim.model.recorded_stages``)."""
    wall0 = time.perf_counter()
    gpu, cpu = build_costs(config) if costs is None else costs
    sched_config = config.scheduler_config()
    as_cluster = config.replicas > 1 if cluster is None else cluster
    schedulers: list[Any] = [Scheduler(sched_config) for _ in range(config.replicas)]
    if record_calls:
        schedulers = [RecordingScheduler(s) for s in schedulers]
    bar = (
        _Bar(len(trace.requests))
        if progress and len(trace.requests) >= PROGRESS_MIN_REQUESTS
        else None
    )
    loop = LoopSettings(
        config.overlap,
        config.fast_forward,
        config.max_run_steps,
        copies=build_copy_costs(config),
        record_steps=record_steps,
    )
    sim: Pipeline | Cluster
    if stages is not None and as_cluster:
        raise ValueError("recorded stages replace the stages of the single pipeline only")
    if as_cluster:
        router = Router(config.router)
        sim = Cluster(
            RequestRecords(trace.requests),
            schedulers,
            router,
            (gpu, cpu),
            num_tokenizers=config.num_tokenizers,
            loop=loop,
            progress=bar,
        )
        replicas: list[Replica] = list(sim.replicas)
        replica_of = np.asarray(sim.replica_of, dtype=np.int64)
    else:
        if config.replicas != 1:
            raise ValueError("the single pipeline runs one replica")
        router = None
        sim = Pipeline(
            trace.requests,
            schedulers[0],
            gpu,
            cpu,
            num_tokenizers=config.num_tokenizers,
            loop=loop,
            progress=bar,
            stages=stages,
        )
        replicas = [sim]
        replica_of = np.zeros(len(trace.requests), dtype=np.int64)
    try:
        sim.run()
    finally:
        if bar is not None:
            bar.bar.close()
    requests = request_frame(sim.records, replicas, replica_of)
    steps = step_frame(replicas)
    engine_steps = step_record_frame(replicas) if record_steps else None
    queues = queue_frame(replicas)
    itl = replicas[0].itl() if len(replicas) == 1 else itl_samples(replicas)
    fast_forward = {
        "enabled": config.fast_forward,
        "runs": sum(r.loop.num_runs for r in replicas),
        "steps_in_runs": sum(r.loop.steps_in_runs for r in replicas),
    }
    del sim, replicas  # their records are in the frames now; the summary's work needs the room
    stats = [s.stats() for s in schedulers]
    prompt = sum(st.prompt_tokens for st in stats)
    summary = summarize(
        requests,
        itl,
        num_steps=len(steps),
        prefix_hit_rate=sum(st.cached_tokens for st in stats) / prompt if prompt else 0.0,
        slo_ttft_ms=config.slo_ttft_ms,
        slo_tpot_ms=config.slo_tpot_ms,
    )
    summary["config"] = config.to_dict()
    summary["cost_model"] = gpu.describe() | {"chosen": config.cost_model_choice()}
    summary["cpu_costs"] = cpu.describe()
    summary["host_kv"] = host_kv_summary(stats, loop.copies)
    summary["trace"] = trace.describe()
    summary["fast_forward"] = fast_forward
    summary["replicas"] = replica_summaries(requests, steps, stats, summary["duration_s"])
    summary["router"] = None if router is None else router_summary(router)
    summary["wall_s"] = time.perf_counter() - wall0
    scheduler = schedulers[0] if len(schedulers) == 1 else schedulers
    return ReplayResult(
        json_safe(summary), requests, steps, queues, itl, scheduler, router, engine_steps
    )


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
    if p.delivered is None:
        raise RuntimeError("queue_frame() before the pipeline ran")
    parts = [p.front_queue_samples("frontend"), p.front_queue_samples("tokenizer")]
    parts.append(
        (
            np.asarray([t for t, _, _ in p.queue_samples], dtype=np.float64),
            np.asarray([n for _, _, n in p.queue_samples], dtype=np.int64),
        )
    )
    parts.append((p.delivered.queue_times, p.delivered.queue_lengths))
    names = ("frontend", "tokenizer", "scheduler", "detokenizer")
    frame = pd.DataFrame(
        {
            "time": np.concatenate([t for t, _ in parts]),
            "stage": np.repeat(names, [len(t) for t, _ in parts]),
            "queue_len": np.concatenate([n for _, n in parts]).astype(np.int64),
        }
    )
    return frame.sort_values("time", kind="stable").reset_index(drop=True)


def request_frame(
    p: RequestRecords, replicas: list[Replica], replica_of: np.ndarray
) -> pd.DataFrame:
    """``requests.csv``: the records of every request, and the replica that served it."""
    t = {k: np.asarray(v, dtype=np.float64) for k, v in p.times.items()}
    delivered = [r.delivered for r in replicas]
    if any(d is None for d in delivered):
        raise RuntimeError("request_frame() before the pipeline ran")
    out_tokens = sum_over(d.output_tokens for d in delivered if d is not None)
    detokenize_s = sum_over(d.detokenize_s for d in delivered if d is not None)
    completed = np.asarray([s == "completed" for s in p.status])
    ttft = np.where(completed, (t["first_token"] - t["arrival"]) * 1e3, np.nan)
    e2e = np.where(completed, (t["finished"] - t["arrival"]) * 1e3, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(completed & (out_tokens > 1), (e2e - ttft) / (out_tokens - 1), np.nan)
    return pd.DataFrame(
        {
            "rid": [r.rid for r in p.trace],
            "status": p.status,
            "reason": p.reason,
            **{k: t[k] for k in TIME_COLUMNS},
            "input_tokens": np.asarray([r.input_length for r in p.trace], dtype=np.int64),
            "output_tokens": out_tokens,
            "cached_tokens": np.asarray(p.cached_tokens, dtype=np.int64),
            "num_preemptions": np.asarray(p.preemptions, dtype=np.int64),
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": e2e,
            "tokenizer_queue_ms": (t["tokenize_start"] - t["tokenizer_enter"]) * 1e3,
            "tokenize_ms": (t["tokenized"] - t["tokenize_start"]) * 1e3,
            "ipc_ms": (t["tokenizer_enter"] - t["parsed"] + t["sched_arrival"] - t["tokenized"])
            * 1e3,
            "scheduler_wait_ms": (t["first_scheduled"] - t["sched_arrival"]) * 1e3,
            "prefill_ms": (t["first_token"] - t["first_scheduled"]) * 1e3,
            "decode_ms": (t["finished"] - t["first_token"]) * 1e3,
            "detokenize_ms": detokenize_s * 1e3,
            "frontend_ms": (t["parsed"] - t["arrival"]) * 1e3,
            "replica": replica_of,
            **{k: t[k] for k in SERVER_TOKEN_COLUMNS},
        },
        columns=[*REQUEST_COLUMNS, "replica", *SERVER_TOKEN_COLUMNS],
    )
