"""A replay: a trace through the simulated pipeline, as the frames and summary of a run."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypedDict, Unpack

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
from sim.costs.acceptance import AcceptanceDraws
from sim.costs.base import CpuCosts, GpuCostModel
from sim.costs.colocation import read_colocation
from sim.costs.copies import CopyCosts, copy_costs
from sim.costs.presets import hardware, model_shape
from sim.costs.profile import cpu_costs_from
from sim.costs.reach import Reach, reach_summary
from sim.disaggregated import pd_cluster, pd_schedulers, pd_summary
from sim.model.calls import RecordingScheduler
from sim.model.cluster import Cluster
from sim.model.drafter import SharedDrafter, self_draft_price
from sim.model.loop_settings import LoopSettings
from sim.model.pipeline import Pipeline
from sim.model.recorded_stages import RecordedStages
from sim.model.replica import FLUSH_STEPS, Progress, Replica, RequestRecords, Streams
from sim.replicas import (
    queue_frame,
    replica_summaries,
    router_summary,
    routing_warning,
    step_frame,
    step_record_frame,
)
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
    if not config.tokenize_busy:  # every prompt at the idle rate
        cpu = replace(cpu, tokenize_busy=())
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


class ReplayOptions(TypedDict, total=False):
    """How ``run_replay`` runs a replay, past its trace and config: ``build_replay``'s keyword
    arguments, whose defaults hold for any left out."""

    record_calls: bool
    progress: bool
    cluster: bool | None
    tables: ReplayTables
    record_steps: bool
    costs: tuple[GpuCostModel, CpuCosts] | None
    stages: RecordedStages | None


def run_replay(trace: Trace, config: SimConfig, **options: Unpack[ReplayOptions]) -> ReplayResult:
    """Simulate ``trace`` under ``config``; deterministic for the same inputs, and the same
    tables whatever ``tables.flush_steps``: ``build_replay``, ``simulate``, ``summarise``.

    ``config.replicas`` > 1 runs the cluster (``sim.model.cluster``); ``cluster=True`` runs
    it for one replica too (the tests compare it with the single pipeline), as does
    ``config.frontend_loop`` (but with ``stages``, which replace the intake).
    ``record_steps`` keeps the step record (``engine_steps``, ``sim.model.step_record``);
    ``costs`` replaces the config's cost models (a validation's recorded steps,
    ``sim.costs.recorded``), ``stages`` the modelled stages around the scheduler of the
    single pipeline (``sim.model.recorded_stages``)."""
    wall0 = time.perf_counter()
    built = build_replay(trace, config, **options)
    simulate(built)
    return summarise(built, trace, config, wall0)


@dataclass(slots=True)
class BuiltReplay:
    """A replay ready to run: the simulation (``None`` once summarised), its replicas, the
    schedulers it drives, the router of a cluster, and where its tables go."""

    sim: Pipeline | Cluster | None
    replicas: list[Replica]
    schedulers: list[Any]
    router: Router | None
    costs: tuple[GpuCostModel, CpuCosts]
    loop: LoopSettings
    request_table: RequestTable
    request_memory: MemoryTable | None
    step_memory: list[MemoryTable]
    bar: _Bar | None


def build_replay(
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
) -> BuiltReplay:
    """The simulation of ``trace`` under ``config``, not yet run (``run_replay`` tells what the
    options do)."""
    gpu, cpu = build_costs(config) if costs is None else costs
    as_cluster = config.num_replicas > 1 if cluster is None else cluster
    if cluster is None and config.frontend_loop and stages is None:
        as_cluster = True  # one server whose frontend loop streams: its intake is timed in the run
    if stages is not None and as_cluster:
        raise ValueError("recorded stages replace the stages of the single pipeline only")
    if not as_cluster and config.replicas != 1:
        raise ValueError("the single pipeline runs one replica")
    sched_config = config.scheduler_config()
    acceptance = config.acceptance_model()
    drafter = None
    if acceptance is not None:
        price = None
        if config.draft_layers is not None:
            fraction = config.draft_layers / model_shape(config.model).num_layers
            price = self_draft_price(fraction, gpu)
        drafter = SharedDrafter(acceptance.draft_share, config.seed, price)
    schedulers: list[Any] = [Scheduler(sched_config, drafter) for _ in range(config.replicas)]
    if config.disaggregated:
        schedulers = pd_schedulers(config, sched_config)
    if record_calls:
        schedulers = [RecordingScheduler(s) for s in schedulers]
    n = len(trace.requests)
    bar = _Bar(n) if progress and n >= PROGRESS_MIN_REQUESTS else None
    loop = LoopSettings(
        config.overlap,
        config.fast_forward,
        config.max_run_steps,
        copies=build_copy_costs(config),
        record_steps=record_steps,
        layout=config.layout,
        acceptance=acceptance,
        seed=config.seed,
        drafter=drafter,
    )
    request_writer, request_memory = _kept(tables.requests, tables.keep)
    built = BuiltReplay(
        None, [], schedulers, None, (gpu, cpu), loop, RequestTable(request_writer),
        request_memory, [], bar,
    )  # fmt: skip

    def step_writer() -> TableWriter:
        writer, memory = _kept(tables.steps, tables.keep)
        if memory is not None:
            built.step_memory.append(memory)
        return writer

    streams = Streams(step_writer, built.request_table.take, tables.flush_steps)
    if as_cluster:
        _build_cluster(built, trace, config, streams)
    else:
        _build_pipeline(built, trace, config, streams, stages)
    return built


def _build_cluster(built: BuiltReplay, trace: Trace, config: SimConfig, streams: Streams) -> None:
    records = RequestRecords(trace.requests, streams)
    options: dict[str, Any] = {
        "num_tokenizers": config.num_tokenizers,
        "loop": built.loop,
        "progress": built.bar,
        "colocation": read_colocation(config.colocation) if config.colocation else None,
        "frontend_loop": config.frontend_loop,
    }
    sim: Cluster
    if config.disaggregated:
        sim = pd_cluster(records, built.schedulers, built.costs, config, **options)
        built.router = sim.decode_router
    else:
        built.router = Router(config.router)
        options["shared_frontend"] = config.shared_frontend
        sim = Cluster(records, built.schedulers, built.router, built.costs, **options)
    built.sim, built.replicas = sim, list(sim.replicas)
    built.request_table.attach(sim.records, sim.replica_of)


def _build_pipeline(
    built: BuiltReplay,
    trace: Trace,
    config: SimConfig,
    streams: Streams,
    stages: RecordedStages | None,
) -> None:
    gpu, cpu = built.costs
    sim = Pipeline(
        trace.requests,
        built.schedulers[0],
        gpu,
        cpu,
        num_tokenizers=config.num_tokenizers,
        loop=built.loop,
        progress=built.bar,
        stages=stages,
        streams=streams,
    )
    built.sim, built.replicas = sim, [sim]
    built.request_table.attach(sim.records, np.zeros(len(trace.requests), dtype=np.int64))


def simulate(built: BuiltReplay) -> None:
    """Run the built replay to its end."""
    if built.sim is None:
        raise RuntimeError("this replay has run and been summarised")
    try:
        built.sim.run()
    finally:
        if built.bar is not None:
            built.bar.bar.close()


def summarise(built: BuiltReplay, trace: Trace, config: SimConfig, wall0: float) -> ReplayResult:
    """The frames and the summary of a run replay; the simulation is let go first (its records
    are in the frames then, and the summary's work needs the room)."""
    if built.sim is None:
        raise RuntimeError("this replay has been summarised")
    replicas = built.replicas
    summary_columns = built.request_table.close(len(trace.requests))
    memory = built.request_memory
    requests = summary_columns if memory is None else memory.frame()
    steps = step_frame(built.step_memory)
    engine_steps = step_record_frame(replicas) if built.loop.record_steps else None
    queues = queue_frame(replicas)
    itl = built.sim.records.totals.itl_s
    busy_s = [r.steps.busy_s.sum() for r in replicas]
    num_steps = sum(r.steps.num_steps for r in replicas)
    fast_forward, reach = _loop_counters(replicas, config)
    draws = [r.loop.draws for r in replicas if r.loop.draws is not None]
    disaggregation = pd_summary(built.sim)
    built.sim, built.replicas = None, []
    del replicas
    stats = [s.stats() for s in built.schedulers]
    prompt = sum(st.prompt_tokens for st in stats)
    summary = summarize(
        summary_columns,
        itl,
        num_steps=num_steps,
        prefix_hit_rate=sum(st.cached_tokens for st in stats) / prompt if prompt else 0.0,
        slo_ttft_ms=config.slo_ttft_ms,
        slo_tpot_ms=config.slo_tpot_ms,
    )
    gpu, cpu = built.costs
    summary["config"] = config.to_dict()
    summary["overlap"] = config.overlap_choice()
    summary["cost_model"] = gpu.describe() | {
        "chosen": config.cost_model_choice(),
        "reach": reach_summary(gpu.measured_reach(), reach),
    }
    summary["cpu_costs"] = cpu.describe()
    summary["host_kv"] = host_kv_summary(stats, built.loop.copies)
    drafter = built.schedulers[0].drafter if built.schedulers else None
    summary["speculative"] = speculative_summary(config, draws, drafter)
    summary["trace"] = trace.describe()
    summary["fast_forward"] = fast_forward
    summary["replicas"] = replica_summaries(summary_columns, busy_s, stats, summary["duration_s"])
    summary["router"] = (
        None
        if built.router is None
        else router_summary(built.router, routing_warning(trace, config))
    )
    summary["disaggregation"] = disaggregation
    summary["wall_s"] = time.perf_counter() - wall0
    schedulers = built.schedulers
    scheduler = schedulers[0] if len(schedulers) == 1 else schedulers
    return ReplayResult(
        json_safe(summary), requests, steps, queues, itl, scheduler, built.router, engine_steps
    )


def speculative_summary(
    config: SimConfig, draws: list[AcceptanceDraws], drafter: SharedDrafter | None
) -> dict[str, Any]:
    """The drafter modelled, its acceptance model and what the replicas drew (the counters of
    the engine's ``/metrics``, summed; ``undrafted_slots``: decode slots given no draft)."""
    if not config.speculating or drafter is None:
        return {"method": "none"}
    total = AcceptanceDraws(draws[0].model, config.seed)
    for d in draws:
        total.add(d)
    method = {"method": config.speculative, "num_draft_tokens": config.num_draft_tokens}
    return method | total.describe() | {"undrafted_slots": drafter.undrafted}


def _loop_counters(replicas: list[Replica], config: SimConfig) -> tuple[dict[str, Any], Reach]:
    """The fast-forwarded runs of the replicas' loops, and the step shapes they priced."""
    fast_forward = {
        "enabled": config.fast_forward,
        "runs": sum(r.loop.num_runs for r in replicas),
        "steps_in_runs": sum(r.loop.steps_in_runs for r in replicas),
    }
    reach = Reach()
    for r in replicas:
        reach.merge(r.loop.reach)
    return fast_forward, reach
