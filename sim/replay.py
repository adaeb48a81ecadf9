"""A replay: a trace through the simulated pipeline, as the frames and summary of a run."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from core.router import Router
from core.scheduler import Scheduler, SchedulerStats
from schema.jsonsafe import json_safe
from schema.metrics import summarize
from schema.run import RunResult
from schema.tables import MemoryTable, TableWriter, TeeTable
from schema.traces import Trace
from sim.config import SimConfig
from sim.costs import load_cpu_costs, make_cost_model, read_profile
from sim.costs.base import CpuCosts, GpuCostModel
from sim.costs.colocation import read_colocation
from sim.costs.copies import CopyCosts, copy_costs
from sim.costs.presets import hardware
from sim.costs.profile import cpu_costs_from
from sim.costs.reach import Reach, reach_summary
from sim.model.calls import RecordingScheduler
from sim.model.cluster import Cluster
from sim.model.pipeline import Pipeline
from sim.model.recorded_stages import RecordedStages
from sim.model.replica import FLUSH_STEPS, Progress, Replica, RequestRecords, Streams
from sim.model.scheduler_loop import LoopSettings
from sim.replicas import replica_summaries, router_summary, step_frame, step_record_frame
from sim.request_table import RequestTable

PROGRESS_MIN_REQUESTS = 1000


@dataclass(slots=True)
class ReplayResult(RunResult):
    """A simulated run, the scheduler (or ``RecordingScheduler``) that was driven (a list of
    them, one per replica, for several), the router of a cluster, and the step record
    (``engine_steps.csv``) where it was kept. Where the tables went to files as the run
    went (``ReplayTables``), ``requests`` holds the columns the summary reads and ``steps``
    is empty, unless ``keep`` kept them."""

    scheduler: Any = None
    router: Router | None = None
    engine_steps: pd.DataFrame | None = None  # the step record, where it was kept


@dataclass(frozen=True, slots=True)
class ReplayTables:
    """Where the request table and each replica's step table go as the replay runs (a new
    writer for each: memory by default, else files), every ``flush_steps`` steps; ``keep``:
    keep them in memory too (the result's frames), for a report."""

    requests: Callable[[], TableWriter] = MemoryTable
    steps: Callable[[], TableWriter] = MemoryTable
    flush_steps: int = FLUSH_STEPS
    keep: bool = True


def _kept(make: Callable[[], TableWriter], keep: bool) -> tuple[TableWriter, MemoryTable | None]:
    """A writer from ``make``, and the memory copy that ``keep`` asks for (the writer itself
    when it is memory)."""
    writer = make()
    if isinstance(writer, MemoryTable):
        return writer, writer
    if not keep:
        return writer, None
    memory = MemoryTable()
    return TeeTable(writer, memory), memory


class _Bar(Progress):
    def __init__(self, total: int) -> None:
        self.bar = tqdm(total=total, unit="req", file=sys.stderr, desc="replay", mininterval=0.5)

    def update(self, n: int) -> None:
        self.bar.update(n)


def build_costs(config: SimConfig) -> tuple[GpuCostModel, CpuCosts]:
    profile = read_profile(config.profile) if config.profile else None
    gpu = make_cost_model(config.cost_model, config.cost_spec(profile))
    cpu = load_cpu_costs(profile)
    if config.cpu_profile:  # asked for: its CPU rows first (a profile of the runs' host)
        cpu = cpu_costs_from(read_profile(config.cpu_profile), fallback=cpu)
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
    tables: ReplayTables = ReplayTables(),
    record_steps: bool = False,
    costs: tuple[GpuCostModel, CpuCosts] | None = None,
    stages: RecordedStages | None = None,
) -> ReplayResult:
    """Simulate ``trace`` under ``config``; deterministic for the same inputs, and the same
    tables whatever ``tables.flush_steps``.

    ``config.replicas`` > 1 runs the cluster (``sim.model.cluster``); ``cluster=True`` runs
    it for one replica too (the tests compare it with the single pipeline), as does
    ``config.frontend_loop`` (but with ``stages``, which replace the intake).
    ``record_steps`` keeps the step record (``engine_steps``, ``sim.model.step_record``);
    ``costs`` replaces the config's cost models (a validation's recorded steps,
    ``sim.costs.recorded``), ``stages`` the modelled stages around the scheduler of the
    single pipeline (``sim.model.recorded_stages``)."""
    wall0 = time.perf_counter()
    gpu, cpu = build_costs(config) if costs is None else costs
    sched_config = config.scheduler_config()
    as_cluster = config.replicas > 1 if cluster is None else cluster
    if cluster is None and config.frontend_loop and stages is None:
        as_cluster = True  # one server whose frontend loop streams: its intake is timed in the run
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
    request_writer, request_memory = _kept(tables.requests, tables.keep)
    request_table = RequestTable(request_writer)
    step_memory: list[MemoryTable] = []

    def step_writer() -> TableWriter:
        writer, memory = _kept(tables.steps, tables.keep)
        if memory is not None:
            step_memory.append(memory)
        return writer

    streams = Streams(step_writer, request_table.take, tables.flush_steps)
    sim: Pipeline | Cluster
    if stages is not None and as_cluster:
        raise ValueError("recorded stages replace the stages of the single pipeline only")
    colocation = read_colocation(config.colocation) if config.colocation else None
    if as_cluster:
        router = Router(config.router)
        sim = Cluster(
            RequestRecords(trace.requests, streams),
            schedulers,
            router,
            (gpu, cpu),
            num_tokenizers=config.num_tokenizers,
            loop=loop,
            progress=bar,
            colocation=colocation,
            shared_frontend=config.shared_frontend,
            frontend_loop=config.frontend_loop,
        )
        replicas: list[Replica] = list(sim.replicas)
        request_table.attach(sim.records, sim.replica_of)
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
            streams=streams,
        )
        replicas = [sim]
        request_table.attach(sim.records, np.zeros(len(trace.requests), dtype=np.int64))
    try:
        sim.run()
    finally:
        if bar is not None:
            bar.bar.close()
    summary_columns = request_table.close(len(trace.requests))
    requests = summary_columns if request_memory is None else request_memory.frame()
    steps = step_frame(step_memory)
    engine_steps = step_record_frame(replicas) if record_steps else None
    queues = queue_frame(replicas)
    itl = sim.records.totals.itl_s
    busy_s = [r.steps.busy_s.sum() for r in replicas]
    num_steps = sum(r.steps.num_steps for r in replicas)
    fast_forward = {
        "enabled": config.fast_forward,
        "runs": sum(r.loop.num_runs for r in replicas),
        "steps_in_runs": sum(r.loop.steps_in_runs for r in replicas),
    }
    reach = Reach()
    for r in replicas:
        reach.merge(r.loop.reach)
    del sim, replicas  # their records are in the frames now; the summary's work needs the room
    stats = [s.stats() for s in schedulers]
    prompt = sum(st.prompt_tokens for st in stats)
    summary = summarize(
        summary_columns,
        itl,
        num_steps=num_steps,
        prefix_hit_rate=sum(st.cached_tokens for st in stats) / prompt if prompt else 0.0,
        slo_ttft_ms=config.slo_ttft_ms,
        slo_tpot_ms=config.slo_tpot_ms,
    )
    summary["config"] = config.to_dict()
    summary["cost_model"] = gpu.describe() | {
        "chosen": config.cost_model_choice(),
        "reach": reach_summary(gpu.measured_reach(), reach),
    }
    summary["cpu_costs"] = cpu.describe()
    summary["host_kv"] = host_kv_summary(stats, loop.copies)
    summary["trace"] = trace.describe()
    summary["fast_forward"] = fast_forward
    summary["replicas"] = replica_summaries(summary_columns, busy_s, stats, summary["duration_s"])
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
