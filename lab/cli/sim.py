"""The ``sim`` command: ``sim replay TRACE ... --out DIR`` and ``sim gen ... --out FILE``."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any

from core.router.options import add_router_flags
from core.scheduler.options import add_scheduler_flags
from lab.memory import keep_mmap_threshold
from lab.sweep.cli import add_capacity_args, add_sweep_args, cmd_capacity, cmd_sweep
from lab.validate.command import add_validate_args
from schema.tables import STEP_FORMATS, CsvTable, MemoryTable, TableWriter, table_writer
from schema.traces import Trace, TraceError, generate, load_trace
from sim.config import CONFIG_KEYS, SimConfig, build_config
from sim.costs import COST_MODELS, ProfileError, read_profile
from sim.costs.reach import reach_warning
from sim.model.replica import FLUSH_STEPS
from sim.replay import ReplayTables


def _replay_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("replay", help="replay a trace through the simulated pipeline")
    p.add_argument("trace", type=Path, help="a .jsonl (Mooncake fields) or Azure .csv trace")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--config", type=Path, help="JSON or TOML config file")
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
    p.add_argument("--num-tokenizers", type=int)
    p.add_argument(
        "--replicas", type=int, help="N replicas of the server behind one router (default: 1)"
    )
    p.add_argument(
        "--colocation",
        metavar="FILE",
        help="the replicas share one GPU (engine serve --dp-share-gpu) and stretch each other's "
        "steps by this co-location table (scripts/fit_colocation.py writes one)",
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
        help="overlap scheduling: plan step N+1 while step N runs on the GPU",
    )
    p.add_argument(
        "--fast-forward",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="advance runs of identical decode steps at once (same results)",
    )
    p.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        help="X > 1 replays X times faster (arrival times divided by X)",
    )
    p.add_argument("--limit", type=int, help="replay only the first N requests (by arrival)")
    p.add_argument("--slo-ttft-ms", type=float)
    p.add_argument("--slo-tpot-ms", type=float)
    p.add_argument("--no-report", action="store_true", help="skip report.html")
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
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_scheduler_flags(p)
    add_router_flags(p)


def _gen_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gen", help="write a synthetic trace (JSONL)")
    p.add_argument("--arrival", choices=["poisson", "gamma"], default="poisson")
    p.add_argument("--rate", type=float, required=True, help="mean requests per second")
    p.add_argument("--cv", type=float, default=1.0, help="gamma: coefficient of variation")
    p.add_argument("--input", required=True, help="fixed:N | uniform:A:B | empirical:TRACE")
    p.add_argument("--output", required=True, help="fixed:N | uniform:A:B | empirical:TRACE")
    p.add_argument("--num", type=int, required=True)
    p.add_argument(
        "--prefix-groups",
        type=int,
        default=0,
        help="shared prefixes: each request draws one of G groups (0: none); G sets the reuse "
        "distance",
    )
    p.add_argument(
        "--prefix-len",
        default="fixed:0",
        help="tokens of each group's shared prefix, drawn once per group (whole 512-token "
        "blocks are shared): fixed:N | uniform:A:B | empirical:TRACE",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)


def _goodput_line(goodput: dict[str, Any]) -> str:
    slos = [
        f"{name} <= {goodput[key]:g} ms"
        for name, key in (("ttft", "slo_ttft_ms"), ("tpot", "slo_tpot_ms"))
        if goodput.get(key) is not None
    ]
    if not slos:
        return "goodput      - (no SLO given: --slo-ttft-ms, --slo-tpot-ms)"
    return f"goodput      {goodput['value']:.2f} req/s ({', '.join(slos)})"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if isinstance(v, float) else str(v)


def format_summary(summary: dict[str, Any]) -> str:
    """The table ``sim replay`` prints."""
    cm = summary["cost_model"]
    lines = [
        f"trace        {summary['trace']['path']} ({summary['num_requests']} requests)",
        f"cost model   {cm['name']} (profile: {cm['profile'] or 'none'})",
        f"chosen       {cm.get('chosen', 'as requested')}",
        f"provenance   {cm['provenance']}",
        *(f"warning      {w}" for w in [reach_warning(cm.get("reach"))] if w),
        f"cpu costs    {summary['cpu_costs']['source']}",
        f"completed    {summary['completed']}   rejected {summary['rejected']}",
        f"duration     {summary['duration_s']:.1f} s simulated, {summary['num_steps']} steps, "
        f"{summary['wall_s']:.1f} s wall",
        f"throughput   {summary['request_throughput']:.2f} req/s, "
        f"{summary['output_throughput']:.0f} output tok/s, "
        f"{summary['input_throughput']:.0f} input tok/s",
        _goodput_line(summary["goodput"]),
        f"prefix hits  {summary['prefix_hit_rate']:.1%}",
        "",
        f"{'metric':<10}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}",
    ]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        s = summary[key]
        lines.append(
            f"{key:<10}" + "".join(f"{_fmt(s[q]):>12}" for q in ("mean", "p50", "p90", "p99"))
        )
    if summary.get("rejected_reasons"):
        lines.append("")
        lines += [f"rejected: {n} x {reason}" for reason, n in summary["rejected_reasons"].items()]
    verdict = summary.get("bottleneck")
    if verdict:
        lines.append("")
        text = verdict.get("text") if isinstance(verdict, dict) else None
        lines.append(f"bottleneck   {text or verdict}")
    return "\n".join(lines)


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
        steps=steps if config.replicas == 1 else MemoryTable,
        flush_steps=args.flush_steps,
        keep=not args.no_report or args.timeline,
    )


def cmd_replay(args: argparse.Namespace) -> int:
    config = replay_config(args)
    trace = load_trace(args.trace, rate_scale=args.rate_scale, limit=args.limit)
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
    from sim.replay import run_replay

    tables = replay_tables(args, config)
    result = run_replay(
        trace, config, progress=not args.no_progress, tables=tables, record_steps=args.record_steps
    )
    written = frozenset({"requests"} if config.replicas > 1 else {"requests", "steps"})
    summary = write_outputs(
        result, args.out, report=not args.no_report, steps=args.steps, written=written
    )
    write_step_record(result.engine_steps, args.out)
    if args.timeline:
        write_timeline(args.out / TIMELINE_NAME, result.requests, result.steps, "sim replay")
    print(format_summary(summary))
    warning = overlap_warning(config)
    if warning:
        print(warning)
    print(f"\noutputs in {args.out}/")
    return 0


def overlap_warning(config: SimConfig) -> str | None:
    """A line when the profile is a CUDA engine's, which overlaps scheduling by default, and
    this replay ran the strict loop."""
    if config.overlap or not config.profile:
        return None
    if not read_profile(config.profile).provenance.get("device", "").startswith("cuda"):
        return None
    return (
        "warning      the profile is of a CUDA engine, which overlaps scheduling unless served "
        "with --no-overlap; this replay ran the strict loop (--overlap simulates the default)"
    )


def cmd_gen(args: argparse.Namespace) -> int:
    n = generate(
        args.out,
        arrival=args.arrival,
        rate=args.rate,
        input_spec=args.input,
        output_spec=args.output,
        num=args.num,
        seed=args.seed,
        cv=args.cv,
        prefix_groups=args.prefix_groups,
        prefix_len=args.prefix_len,
    )
    print(f"wrote {n} requests to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sim", description="Discrete-event LLM serving simulator")
    sub = parser.add_subparsers(dest="command", required=True)
    _replay_args(sub)
    _gen_args(sub)
    add_sweep_args(sub)
    add_capacity_args(sub)
    add_validate_args(sub)
    return parser


def replay_config(args: argparse.Namespace) -> SimConfig:
    """The config of ``sim replay``: defaults, ``--config``, then the flags named after a key."""
    flags = {name: getattr(args, name) for name in CONFIG_KEYS if hasattr(args, name)}
    return build_config(args.config, **flags)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_mmap_threshold()
    commands = {"replay": cmd_replay, "gen": cmd_gen, "sweep": cmd_sweep, "capacity": cmd_capacity}
    try:
        if hasattr(args, "func"):
            return int(args.func(args))
        return commands[args.command](args)
    except (TraceError, ProfileError, ValueError) as exc:
        print(f"sim {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
