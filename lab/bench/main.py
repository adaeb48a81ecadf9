"""``engine bench TRACE --url URL --out DIR``: replay a trace against an OpenAI-compatible server.

Writes what ``sim replay`` writes (``requests.csv``, ``steps.csv``,
``queues.csv``, ``summary.json``, ``report.html``; ``timeline.json`` with
``--timeline``), from client-side times plus this engine's stage timestamps
when the server is this engine; with ``--server-steps`` also the engine's own
step record of the run (``engine_steps.csv``, see ``lab.bench.server_steps``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from lab.bench.client import Target
from lab.bench.prompts import PromptMaker, fresh_salt
from lab.bench.run import BenchResult, run_bench, tokenizer_for
from lab.bench.server import ServerInfo, server_info
from lab.outputs import write_outputs
from lab.report.plotlyjs import INLINE, PlotlyJs, add_plotlyjs_argument
from schema.perfetto import TIMELINE_NAME, write_timeline
from schema.run import RunResult
from schema.steprecord import STEP_RECORD_NAME, replica_record_path
from schema.tables import write_csv
from schema.traces import Trace, TraceError, load_trace


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="engine bench", description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path, help="a .jsonl (Mooncake fields, sim gen) or Azure .csv")
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--rate-scale", type=float, default=1.0, help="X > 1 replays X times faster")
    p.add_argument("--limit", type=int, help="only the first N requests (by arrival)")
    p.add_argument("--model", help="model name to request (default: the server's first model)")
    p.add_argument(
        "--tokenizer",
        help="tokenizer the prompts are measured with (default: the server's model folder "
        "when it is on this machine, else smollm2-135m)",
    )
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument(
        "--server-timestamps",
        choices=("auto", "on", "off"),
        default="auto",
        help="ask for this engine's stage timestamps (auto: when the server is this engine)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed requests sent first, with prompts of their own (as long as the first "
        "request's) that no measured request shares",
    )
    p.add_argument(
        "--prompt-salt",
        help="seed prefix of the prompt texts (default: a fresh one, so that no run finds an "
        "earlier run's prompts in the server's prefix cache; given, runs repeat exactly)",
    )
    p.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="freeze the load generator's heap out of garbage collection after the warm-up, so "
        "that no full collection stalls its event loop mid-run (default: on)",
    )
    p.add_argument(
        "--server-steps",
        nargs="?",
        const="",
        metavar="PATH",
        help=f"write {STEP_RECORD_NAME}: the steps the server recorded during the run, read "
        "from PATH (the file of its --record-steps; without PATH, the one its model card names; "
        "a server of several replicas writes a file per replica beside it, all read)",
    )
    p.add_argument("--slo-ttft-ms", type=float)
    p.add_argument("--slo-tpot-ms", type=float)
    p.add_argument("--timeline", action="store_true", help=f"also write {TIMELINE_NAME}")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    add_plotlyjs_argument(p)
    p.add_argument("--no-progress", action="store_true")
    return p


def format_result(summary: dict[str, Any]) -> str:
    """The summary table both ``engine bench`` and ``sim validate`` print for a real run."""
    lines = [
        f"completed    {summary['completed']} of {summary['num_requests']}   rejected "
        f"{summary['rejected']}   failed {summary['failed']}",
        f"duration     {summary['duration_s']:.1f} s, {summary['num_steps']} steps seen",
        f"throughput   {summary['request_throughput']:.2f} req/s, "
        f"{summary['output_throughput']:.0f} output tok/s",
        f"send lag     max {summary['bench']['max_send_lag_ms']:.1f} ms",
        f"{'metric':<10}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}",
    ]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        values = [summary[key][q] for q in ("mean", "p50", "p90", "p99")]
        lines.append(f"{key:<10}" + "".join("-".rjust(12) if v is None else f"{v:12,.1f}"
                                            for v in values))  # fmt: skip
    return "\n".join(lines)


def write_bench(
    result: RunResult, out: Path, *, report: bool, timeline: bool, plotlyjs: PlotlyJs = INLINE
) -> None:
    write_outputs(result, out, report=report, plotlyjs=plotlyjs)
    if isinstance(result, BenchResult) and result.engine_steps is not None:
        write_csv(result.engine_steps, out / STEP_RECORD_NAME)
    if timeline:
        write_timeline(out / TIMELINE_NAME, result.requests, result.steps, "engine bench")


def server_steps_paths(given: str | None, info: ServerInfo) -> list[Path] | None:
    """The step record to read after the run: ``given`` (``""``: the one the server names),
    a file per replica of the server (``replica_record_path``); ``ValueError`` when there
    is none to read."""
    if given is None:
        return None
    if info.ours and info.record_steps is None:
        raise ValueError(f"{info.url} records no steps: start it with --record-steps PATH")
    named = given or info.record_steps
    if not named:
        raise ValueError(f"{info.url} names no step record; give --server-steps PATH")
    paths = [replica_record_path(Path(named), k, info.dp) for k in range(info.dp)]
    for path in paths:
        if not path.is_file():
            raise ValueError(f"--server-steps: no step record at {path}")
    return paths


def arrival_span_line(trace: Trace, rate_scale: float) -> str:
    """How long the run lasts at least: its requests are sent at the trace's arrival times."""
    span = trace.duration_s
    minutes = f"{span / 60:.1f} min" if span >= 90 else f"{span:.0f} s"
    return (
        f"engine bench: {len(trace.requests)} requests arriving over {minutes} "
        f"(the trace's arrivals at --rate-scale {rate_scale:g}); the run lasts at least that "
        "long, plus the last request's service"
    )


def bench_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        info = server_info(args.url, args.api_key)
        trace = load_trace(args.trace, rate_scale=args.rate_scale, limit=args.limit)
        print(arrival_span_line(trace, args.rate_scale), file=sys.stderr, flush=True)
        tokenizer, folder = tokenizer_for(args.tokenizer, info)
        meta = info.ours if args.server_timestamps == "auto" else args.server_timestamps == "on"
        target = Target(info.url, args.model or info.model, meta, args.api_key)
        salt = fresh_salt() if args.prompt_salt is None else args.prompt_salt
        steps_path = server_steps_paths(args.server_steps, info)
        config = {
            "server": info.owned_by,
            "tokenizer": folder,
            "prompt_salt": salt,
            "kv_pages_total": info.kv_pages_total,
            "max_model_len": info.max_model_len,
        }
        result = run_bench(
            trace,
            target,
            PromptMaker(tokenizer, salt),
            progress=not args.no_progress,
            warmup=args.warmup,
            slo_ttft_ms=args.slo_ttft_ms,
            slo_tpot_ms=args.slo_tpot_ms,
            config=config,
            gc_freeze=args.gc_freeze,
            server_steps=steps_path,
        )
    except (TraceError, ValueError, OSError) as exc:
        print(f"engine bench: error: {exc}", file=sys.stderr)
        return 2
    write_bench(
        result,
        args.out,
        report=not args.no_report,
        timeline=args.timeline,
        plotlyjs=PlotlyJs(args.plotlyjs),
    )
    print(format_result(result.summary))
    print(f"\noutputs in {args.out}/")
    return 0
