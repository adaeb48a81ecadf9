"""``sim replay TRACE --out DIR``: a trace through the simulated pipeline, its outputs written
and its summary printed."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

from core.router.options import add_router_flags
from core.scheduler.options import add_scheduler_flags
from core.settings import add_flags
from lab.replay.summary import format_summary
from lab.report.plotlyjs import PlotlyJs, add_plotlyjs_argument
from schema.tables import STEP_FORMATS, CsvTable, MemoryTable, TableWriter, table_writer
from schema.traces import Trace, load_trace
from sim.config import CONFIG_KEYS, SimConfig, build_config
from sim.costs import COST_MODELS
from sim.model.replica import FLUSH_STEPS
from sim.replay import ReplayTables, run_replay
from sim.replicas import routing_warning


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("replay", help="replay a trace through the simulated pipeline")
    p.add_argument("trace", type=Path, help="a .jsonl (Mooncake fields) or Azure .csv trace")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--config", type=Path, help="JSON or TOML config file")
    _cost_args(p)
    _pipeline_args(p)
    _run_args(p)
    _output_args(p)
    add_flags(p, SimConfig)  # the simulator's own settings declared with a flag
    add_scheduler_flags(p)
    add_router_flags(p)
    p.set_defaults(func=cmd_replay)


def _cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="profile CSV (implies --cost-model table)")
    p.add_argument(
        "--cpu-profile",
        metavar="FILE",
        help="CPU stage costs from this profile first (e.g. engine profile --no-steps of the "
        "host that serves), the profile's after",
    )
    p.add_argument(
        "--cost-model",
        choices=sorted(COST_MODELS),
        help="default: table, fitted to the committed profile of the model on the hardware "
        "(profiles/HARDWARE_MODEL[_tpN].csv) when there is one, else roofline",
    )
    p.add_argument("--model", help="model preset (llama-3.1-8b, qwen3-0.6b, smollm2-135m)")
    p.add_argument("--tp", type=int, help="tensor-parallel degree")


def _pipeline_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-tokenizers", type=int, help="tokenizer workers of each server")
    p.add_argument(
        "--replicas", type=int, help="N replicas of the server behind one router (default: 1)"
    )
    p.add_argument(
        "--colocation",
        metavar="FILE",
        help="the replicas share one GPU (engine serve --dp-share-gpu) and stretch each other's "
        "steps by this co-location table (sim colocation fit writes one)",
    )
    p.add_argument(
        "--shared-frontend",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the replicas share one frontend and tokenizer pool, as engine serve --dp N runs "
        "them (default: each its own, as N servers behind engine router)",
    )
    p.add_argument(
        "--frontend-loop",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the frontend's one event loop also streams the tokens: a request's intake waits "
        "behind the chunks streamed before it (default: off, two separate queues; at a "
        "chunk's true cost the two agree within a point on P50 and P90, and the loop is slower)",
    )
    p.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="overlap scheduling: plan step N+1 while step N runs on the GPU (default: the loop "
        "the profile's engine runs: on for a profile measured on CUDA, off for one measured on "
        "CPU or without a profile)",
    )
    p.add_argument(
        "--fast-forward",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="advance runs of identical decode steps at once (same results)",
    )


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        help="X > 1 replays X times faster (arrival times divided by X)",
    )
    p.add_argument("--limit", type=int, help="replay only the first N requests (by arrival)")
    p.add_argument("--slo-ttft-ms", type=float, help="goodput SLO on TTFT")
    p.add_argument("--slo-tpot-ms", type=float, help="goodput SLO on TPOT")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    add_plotlyjs_argument(p)
    p.add_argument(
        "--steps",
        choices=STEP_FORMATS,
        default="csv",
        help="the per-step table: steps.csv (default), the compact steps.parquet, or none",
    )
    p.add_argument(
        "--flush-steps",
        type=int,
        default=FLUSH_STEPS,
        help="steps between two writes of the tables as the run goes (memory holds about "
        "one chunk; the files are the same for any value)",
    )
    p.add_argument("--timeline", action="store_true", help="also write timeline.json (Perfetto)")
    p.add_argument(
        "--record-steps",
        action="store_true",
        help="also write engine_steps.csv, the step record the engine writes, for the "
        "simulated steps (schema/steprecord.py)",
    )


def replay_config(args: argparse.Namespace) -> SimConfig:
    """The config of ``sim replay``: defaults, ``--config``, then the flags named after a key."""
    flags = {name: getattr(args, name) for name in CONFIG_KEYS if hasattr(args, name)}
    return build_config(args.config, **flags)


def replay_tables(args: argparse.Namespace, config: SimConfig) -> ReplayTables:
    """``sim replay`` writes ``requests.csv`` and (for one replica) the step table as the
    run goes; it keeps them in memory too only for ``report.html`` or ``--timeline``."""
    from lab.outputs import REQUESTS_NAME, step_table_name

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    def steps() -> TableWriter:
        return table_writer(args.steps, out / step_table_name(args.steps))

    return ReplayTables(
        requests=lambda: CsvTable(out / REQUESTS_NAME),
        steps=steps if config.num_replicas == 1 else MemoryTable,
        flush_steps=args.flush_steps,
        keep=not args.no_report or args.timeline,
    )


def cmd_replay(args: argparse.Namespace) -> int:
    config = replay_config(args)
    trace = load_trace(args.trace, rate_scale=args.rate_scale, limit=args.limit)
    warning = routing_warning(trace, config)
    if warning:
        print(f"sim replay: warning: {warning}", file=sys.stderr)
    if gc.get_freeze_count():  # frozen by the caller: leave its collector as it is
        return _replay(args, config, trace)
    gc.freeze()  # the trace lives to the end: no collection needs to walk its millions of objects
    try:
        return _replay(args, config, trace)
    finally:
        gc.unfreeze()  # as it was, for a caller in the same process


def _replay(args: argparse.Namespace, config: SimConfig, trace: Trace) -> int:
    from lab.outputs import write_outputs, write_step_record
    from schema.perfetto import TIMELINE_NAME, write_timeline

    tables = replay_tables(args, config)
    result = run_replay(
        trace, config, progress=not args.no_progress, tables=tables, record_steps=args.record_steps
    )
    written = frozenset({"requests"} if config.num_replicas > 1 else {"requests", "steps"})
    summary = write_outputs(
        result,
        args.out,
        report=not args.no_report,
        steps=args.steps,
        written=written,
        plotlyjs=PlotlyJs(args.plotlyjs),
    )
    write_step_record(result.engine_steps, args.out)
    if args.timeline:
        write_timeline(args.out / TIMELINE_NAME, result.requests, result.steps, "sim replay")
    print(format_summary(summary))
    print(f"\noutputs in {args.out}/")
    return 0
