"""Run a benchmark end to end: prompts, the load, and the outputs in ``sim replay``'s schema."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.bench.client import Target
from lab.bench.frames import itl_seconds, request_frame, step_frame
from lab.bench.load import replay
from lab.bench.prompts import PromptMaker
from lab.bench.server import ServerInfo
from lab.bench.server_steps import run_steps
from schema.jsonsafe import json_safe
from schema.metrics import summarize
from schema.run import RunResult
from schema.samples import WeightedSamples
from schema.traces.record import Trace

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_TOKENIZER = "smollm2-135m"
QUEUE_COLUMNS = ("time", "stage", "queue_len")


@dataclass(slots=True)
class BenchResult(RunResult):
    """A benchmark's result; ``engine_steps``: the engine's step record of the run, where it
    was read (``lab.bench.server_steps``)."""

    engine_steps: pd.DataFrame | None = None


def tokenizer_for(name: str | None, info: ServerInfo) -> tuple[Any, str]:
    """The tokenizer prompts are measured with: ``name``, else the server's own model folder
    when it is on this machine, else ``smollm2-135m``; and the folder it came from."""
    from engine.models.setup import resolve_model
    from engine.tokenizer.prompt import load_tokenizer

    if name is None and info.root and (Path(info.root) / "tokenizer_config.json").is_file():
        folder = Path(info.root)
    else:
        folder = resolve_model(name or DEFAULT_TOKENIZER)
    return load_tokenizer(str(folder)), str(folder)


def run_bench(
    trace: Trace,
    target: Target,
    maker: PromptMaker,
    *,
    progress: bool = True,
    warmup: int = 1,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    config: dict[str, Any] | None = None,
    gc_freeze: bool = True,
    server_steps: list[Path] | None = None,
) -> RunResult:
    """Replay ``trace`` against ``target``; the result in ``sim replay``'s schema (a
    ``BenchResult``, with the engine's step record of the run read from ``server_steps``,
    a file per replica, when given)."""
    import pandas as pd

    prompts = [maker.text(r) for r in trace.requests]
    first = trace.requests[0].input_length if trace.requests else 1
    warm = [maker.warmup_text(i, first) for i in range(warmup)]
    run = asyncio.run(replay(trace, target, prompts, warm, progress, gc_freeze))
    requests = request_frame(run.records, run.epoch0)
    steps = step_frame(run.records, run.epoch0)
    itl = WeightedSamples.of(itl_seconds(run.records))
    done = requests[requests["status"] == "completed"]
    prompt_tokens = float(done["input_tokens"].sum())
    hit_rate = float(done["cached_tokens"].sum()) / prompt_tokens if prompt_tokens else 0.0
    summary = summarize(
        requests,
        itl,
        num_steps=len(steps),
        prefix_hit_rate=hit_rate,
        slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms,
    )
    done_records = [r for r in run.records if r.status == "completed"]
    off = sum(r.usage.get("prompt_tokens", r.input_length) != r.input_length for r in done_records)
    summary["failed"] = int((requests["status"] == "failed").sum())
    summary["config"] = {"url": target.url, "model": target.model, **(config or {})}
    summary["cost_model"] = {
        "name": "measured",
        "profile": None,
        "provenance": f"engine bench against {target.url}: client-side times"
        + ("; server stages from its meta_info" if target.meta_info else ""),
    }
    summary["trace"] = trace.describe()
    summary["bench"] = {
        "max_send_lag_ms": run.max_send_lag_s * 1e3,
        "prompt_length_mismatches": off,
        "server_timestamps": target.meta_info,
        "gc_frozen_objects": run.gc_frozen,
    }
    summary["wall_s"] = run.wall_s
    queues = pd.DataFrame(columns=list(QUEUE_COLUMNS))
    engine_steps = None
    if server_steps is not None:
        engine_steps = run_steps(server_steps, run.records, run.epoch0, run.wall_s)
        summary["bench"]["server_steps"] = {
            "path": ", ".join(str(p) for p in server_steps),
            "steps": len(engine_steps),
        }
    return BenchResult(json_safe(summary), requests, steps, queues, itl, engine_steps)
