"""``sim replay``: run a trace through the pipeline and write its outputs.

Outputs in ``out_dir``: ``requests.csv``, the step table (``steps.csv`` by
default, the compact ``steps.parquet`` on request, or none), ``queues.csv``, ``summary.json``
and, when ``sim.report`` is available, ``report.html``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from engine.scheduler import Scheduler
from sim.calls import RecordingScheduler
from sim.config import SimConfig
from sim.costs import load_cpu_costs, make_cost_model, read_profile
from sim.costs.base import CpuCosts, GpuCostModel
from sim.jsonsafe import json_safe
from sim.metrics import request_frame, summarize
from sim.pipeline import Pipeline, Progress
from sim.samples import WeightedSamples
from sim.tables import STEP_FORMATS, write_csv, write_parquet
from sim.traces import Trace

PROGRESS_MIN_REQUESTS = 1000


@dataclass(slots=True)
class ReplayResult:
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    queues: pd.DataFrame
    itl_s: WeightedSamples
    scheduler: Any  # the Scheduler (or RecordingScheduler) that was driven


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


def run_replay(
    trace: Trace, config: SimConfig, *, record_calls: bool = False, progress: bool = True
) -> ReplayResult:
    """Simulate ``trace`` under ``config``; deterministic for the same inputs."""
    wall0 = time.perf_counter()
    gpu, cpu = build_costs(config)
    sched_config = config.scheduler_config()
    scheduler: Any = Scheduler(sched_config)
    if record_calls:
        scheduler = RecordingScheduler(scheduler)
    bar = (
        _Bar(len(trace.requests))
        if progress and len(trace.requests) >= PROGRESS_MIN_REQUESTS
        else None
    )
    pipeline = Pipeline(
        trace.requests,
        scheduler,
        gpu,
        cpu,
        num_tokenizers=config.num_tokenizers,
        overlap=config.overlap,
        fast_forward=config.fast_forward,
        max_run_steps=config.max_run_steps,
        progress=bar,
    )
    try:
        pipeline.run()
    finally:
        if bar is not None:
            bar.bar.close()
    requests = request_frame(pipeline)
    steps = pipeline.steps.frame()
    queues = queue_frame(pipeline)
    itl = pipeline.itl()
    fast_forward = {
        "enabled": config.fast_forward,
        "runs": pipeline.num_runs,
        "steps_in_runs": pipeline.steps_in_runs,
    }
    del pipeline  # its records are in the frames now; the summary's work needs the room
    stats = scheduler.stats()
    summary = summarize(
        requests,
        itl,
        num_steps=len(steps),
        prefix_hit_rate=stats.prefix_hit_rate,
        slo_ttft_ms=config.slo_ttft_ms,
        slo_tpot_ms=config.slo_tpot_ms,
    )
    summary["config"] = config.to_dict()
    summary["cost_model"] = gpu.describe()
    summary["cpu_costs"] = cpu.describe()
    summary["trace"] = trace.describe()
    summary["fast_forward"] = fast_forward
    summary["wall_s"] = time.perf_counter() - wall0
    return ReplayResult(json_safe(summary), requests, steps, queues, itl, scheduler)


def queue_frame(p: Pipeline) -> pd.DataFrame:
    """Queue length per stage at each change, in time order (stable within a time)."""
    if p.delivered is None:
        raise RuntimeError("queue_frame() before the pipeline ran")
    parts = [p.front.queue_samples("frontend"), p.front.queue_samples("tokenizer")]
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


def write_steps(steps: pd.DataFrame, out_dir: Path, fmt: str) -> None:
    """The step table in ``fmt`` (one of ``STEP_FORMATS``)."""
    if fmt == "parquet":
        write_parquet(steps, out_dir / "steps.parquet")
    elif fmt == "csv":
        write_csv(steps, out_dir / "steps.csv")
    elif fmt != "none":
        raise ValueError(f"unknown step table format {fmt!r}; known: {list(STEP_FORMATS)}")


def write_outputs(
    result: ReplayResult, out_dir: Path, *, report: bool = True, steps: str = "csv"
) -> dict[str, Any]:
    """Write the output files; return the summary (with the verdict when a report was made)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(result.requests, out_dir / "requests.csv")
    write_steps(result.steps, out_dir, steps)
    write_csv(result.queues, out_dir / "queues.csv")
    summary = result.summary
    if report:
        try:
            from sim.report import write_report
        except ImportError as exc:
            print(f"note: no HTML report (sim.report is not available: {exc})", file=sys.stderr)
        else:
            verdict = write_report(
                out_dir, summary, result.requests, result.steps, result.queues, result.itl_s
            )
            summary["bottleneck"] = json_safe(verdict)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
