"""``sim validate``: run a trace on a live server and through the simulator, then compare.

    sim validate TRACE --url URL --profile FILE [--repeats 2] --out DIR

1. Read the server: its model and context (``/v1/models``) and its KV pages
   (``engine_kv_pages_total`` in ``/metrics``, per replica); a server with
   ``dp`` replicas is simulated as a cluster of as many replicas behind the
   router its card names (``sim replay --replicas N --router P``); behind a prefill/decode
   router, its prefill and decode workers (``--prefill-replicas P --decode-replicas D``,
   ``sim.model.pd_cluster``). The scheduler's other limits
   (page size, max running, prefill budget, policy, tokenizer workers) are
   flags with ``engine serve``'s defaults: give the values the server runs with.
2. Drop the trace's requests the server cannot take (prompt plus output
   beyond its context), so both worlds see the same requests.
3. ``engine bench`` the trace ``--repeats`` times (``real-1/``, ``real-2/``, ...),
   noting the load average before and after each run.
4. ``sim replay`` it once with the ``table`` cost model of ``--profile``
   (``sim/``); the CPU stage costs come from the profile too.
5. Write ``comparison.json`` (``lab.validate.compare``, TTFT split by stage included)
   and ``report.html`` (real and simulated CDFs and timelines overlaid); every
   run also writes its own outputs and ``timeline.json``; the simulation also
   its step record (``sim/engine_steps.csv``).
6. Where the real runs hold the engine's step record (``real-N/engine_steps.csv``),
   attribute each metric's error to the step-time model, the CPU stages and
   scheduling divergence (``lab.validate.attribution``): ``attribution.json``, a
   table in the report and in the printed summary.

With ``--real-from DIR`` instead of ``--url``, steps 1-3 are the runs an
earlier validation recorded in ``DIR`` (``lab.validate.revalidate``): a new profile
is checked against the same real runs without a server. With ``--capacity``,
steps 3-5 are a capacity search on the server and in the simulator
(``lab.validate.capacity``), written to ``capacity.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.router import RouterConfig
from core.router.options import router_keys
from core.scheduler.options import add_scheduler_flags
from lab.outputs import write_outputs, write_step_record
from lab.report.plotlyjs import PlotlyJs, add_plotlyjs_argument
from lab.validate.attribution import ATTRIBUTION_NAME, attribute, format_attribution
from lab.validate.capacity import add_capacity_flags, format_capacity, run_capacity
from lab.validate.compare import compare, format_comparison, ttft_parts
from lab.validate.placement import format_placement, placement
from lab.validate.regime import regimes
from lab.validate.revalidate import recorded_config, recorded_runs, recorded_trace
from schema.jsonsafe import json_safe
from schema.perfetto import TIMELINE_NAME, write_timeline
from schema.run import RunResult
from schema.traces import Trace, load_trace
from sim.config import CONFIG_KEYS, SCHEDULER_KEYS, SimConfig, build_config, read_config_file
from sim.costs.committed import profile_dtype
from sim.costs.profile import read_profile
from sim.costs.reach import reach_warning
from sim.replay import run_replay

if TYPE_CHECKING:
    from lab.bench.server import ServerInfo


REAL_FROM_READS = (
    "real_from",
    "profile",
    "overlap",
    "colocation",
    "cpu_profile",
    "tokenize_busy",
    "config",
    "out",
    "no_report",
    "no_progress",
)
"""The options ``--real-from`` reads; the recorded run fixes the others."""


def add_validate_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="compare a live server with its simulation")
    p.add_argument("trace", type=Path, help="a .jsonl (Mooncake fields) or Azure .csv trace")
    p.add_argument("--url", help="the server's base URL")
    p.add_argument(
        "--real-from",
        type=Path,
        nargs="+",
        help="earlier sim validate --out folders (of one trace slice): simulate their recorded "
        "real runs again with --profile, without a server (see lab/validate/revalidate.py)",
    )
    p.add_argument("--profile", required=True, help="profile CSV measured on the server's hardware")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--repeats", type=int, default=2, help="real runs (noise needs two or more)")
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--limit", type=int)
    p.add_argument("--config", type=Path, help="simulator config file (JSON or TOML)")
    p.add_argument("--model", help="the simulator's model preset (default: the server's model)")
    p.add_argument("--tokenizer", help="tokenizer for the prompts (see engine bench)")
    p.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        help="simulate overlap scheduling (default: as the server reports, else the config's)",
    )
    p.add_argument(
        "--num-tokenizers",
        type=int,
        help="tokenizer workers to simulate (default: as the server reports, else 1)",
    )
    p.add_argument(
        "--cpu-profile",
        metavar="FILE",
        help="CPU stage costs from this profile, before --profile's (measure them on the host "
        "that serves: engine profile --no-steps; hosts of one GPU kind differ by 30 %%)",
    )
    p.add_argument(
        "--tokenize-busy",
        action=argparse.BooleanOptionalAction,
        help="price a prompt a tokenizer goes straight on to at the CPU profile's back-to-back "
        "rate (its tokenize_busy_N rows; see sim replay)",
    )
    p.add_argument(
        "--colocation",
        metavar="FILE",
        help="the server's replicas share one GPU (--dp-share-gpu): simulate them stretching "
        "each other's steps by this co-location table (sim colocation fit writes one)",
    )
    p.add_argument("--no-report", action="store_true", help="skip the HTML reports")
    add_plotlyjs_argument(p, default="directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_capacity_flags(p)
    add_scheduler_flags(p)
    p.set_defaults(func=cmd_validate)


def servable(trace: Trace, max_model_len: int | None) -> tuple[Trace, int]:
    """``trace`` without the requests whose prompt plus output exceed ``max_model_len``."""
    if max_model_len is None:
        return trace, 0
    keep = [r for r in trace.requests if r.input_length + r.output_length <= max_model_len]
    return replace(trace, requests=keep), len(trace.requests) - len(keep)


def hardware_warning(server: str | None, profile: Path) -> str | None:
    """Why ``profile`` may not price the server's steps: it names other hardware than the
    server reports (None when they agree or either is unknown)."""
    measured = read_profile(profile).provenance.get("hardware")
    if not server or not measured or server == measured:
        return None
    return (
        f"warning: {profile} was measured on {measured!r}, the server runs on {server!r}: "
        "its step and CPU-stage costs may not hold there (engine profile measures one there)"
    )


def sharing_warning(info: ServerInfo, config: SimConfig) -> str | None:
    """Why the simulated replicas may run faster than the server's: they share its GPU and
    the simulation has no co-location table (None otherwise)."""
    if info.gpu_share < 2 or config.colocation is not None:
        return None
    return (
        f"warning: the server's {info.dp} replicas share a GPU; without --colocation the "
        "simulation prices each replica's steps as if it had the GPU to itself"
    )


def sim_config(args: argparse.Namespace, info: ServerInfo, num_pages: int) -> SimConfig:
    """The flags named after a ``SimConfig`` field, the server's model, pages, overlap mode,
    scheduler settings, replicas, layout, tokenizer workers and router (those that neither a
    flag nor the config file sets), the profile's ``table`` model and dtype."""
    flags = {name: getattr(args, name) for name in CONFIG_KEYS if hasattr(args, name)}
    if flags.get("overlap") is None:
        flags["overlap"] = info.overlap
    in_file = read_config_file(args.config).keys() if args.config else set()
    server = {k: v for k, v in (info.scheduler or {}).items() if k in SCHEDULER_KEYS - {"role"}}
    server["replicas"] = info.dp
    if info.prefill_workers:  # a prefill/decode router: its decode workers are the dp
        server |= {"replicas": 1, "prefill_replicas": info.prefill_workers,
                   "decode_replicas": info.dp}  # fmt: skip
    server["layout"] = info.layout
    if info.num_tokenizers is not None:
        server["num_tokenizers"] = info.num_tokenizers
    shared = info.shared_frontend  # engine router's card: each worker its own frontend
    server["shared_frontend"] = info.dp > 1 if shared is None else shared  # engine serve --dp
    if info.router is not None:
        server |= router_keys(RouterConfig(**info.router))
    for name, value in server.items():
        if flags.get(name) is None and name not in in_file:
            flags[name] = value
    dtype = profile_dtype(args.profile)
    model = args.model or info.model
    flags |= {"model": model, "num_pages": num_pages, "cost_model": "table", "dtype": dtype}
    return build_config(args.config, **flags)


def run_real(args: argparse.Namespace, trace: Trace, info: ServerInfo) -> list[RunResult]:
    """The repeats of ``engine bench``, each written to its directory."""
    from lab.bench.client import Target
    from lab.bench.main import format_result, server_steps_paths, write_bench
    from lab.bench.prompts import PromptMaker, fresh_salt
    from lab.bench.run import run_bench, tokenizer_for

    tokenizer, folder = tokenizer_for(args.tokenizer, info)
    target = Target(info.url, info.model, info.ours)
    steps = None
    if info.record_steps:  # the server keeps a step record: each run's steps come with it
        try:
            steps = server_steps_paths("", info)
        except ValueError as exc:  # e.g. a server on another machine
            print(f"no step record for the attribution: {exc}")
    results = []
    for i in range(1, args.repeats + 1):
        salt = fresh_salt()  # each run's prompts are new to the server's prefix cache
        maker = PromptMaker(tokenizer, salt)
        before = os.getloadavg()[0]
        config = {"server": info.owned_by, "tokenizer": folder, "prompt_salt": salt}
        result = run_bench(
            trace, target, maker, progress=not args.no_progress, config=config, server_steps=steps
        )
        after = os.getloadavg()[0]
        result.summary["bench"]["loadavg_1min"] = {"before": before, "after": after}
        write_bench(
            result,
            args.out / f"real-{i}",
            report=not args.no_report,
            timeline=True,
            plotlyjs=PlotlyJs(args.plotlyjs, args.out),
        )
        print(f"real run {i} (load average {before:.2f} before, {after:.2f} after)")
        print(format_result(result.summary) + "\n")
        results.append(result)
    return results


def run_sim(args: argparse.Namespace, trace: Trace, config: SimConfig) -> RunResult:
    result = run_replay(trace, config, progress=not args.no_progress, record_steps=True)
    out = args.out / "sim"
    write_outputs(
        result, out, report=not args.no_report, plotlyjs=PlotlyJs(args.plotlyjs, args.out)
    )
    write_step_record(result.engine_steps, out)
    write_timeline(out / TIMELINE_NAME, result.requests, result.steps, "sim replay")
    warning = reach_warning(result.summary["cost_model"]["reach"])
    if warning:
        print(f"warning: the simulation went {warning}", file=sys.stderr)
    return result


def command_line(args: argparse.Namespace) -> str:
    """The ``sim validate`` command with every option it read spelled out."""
    parts = ["sim", "validate", str(args.trace)]
    for key, value in vars(args).items():
        if key in ("trace", "command", "func") or value is None or value is False:
            continue
        if args.real_from is not None and key not in REAL_FROM_READS:
            continue
        flag = "--" + key.replace("_", "-")
        parts += [flag] if value is True else [flag, str(value)]
    return shlex.join(parts)


def cmd_validate(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise ValueError("--repeats must be >= 1")
    if (args.url is None) == (args.real_from is None):
        raise ValueError("give --url (a live server) or --real-from DIR (an earlier validation)")
    if args.capacity:
        return validate_capacity(args)
    real: list[RunResult] | None = None
    if args.real_from is not None:
        record, recorded, runs = recorded_runs(args.real_from)
        trace = recorded_trace(args, record, recorded[0][1])
        config = recorded_config(args, record)
        summaries, frames = [s for s, _ in recorded], [r for _, r in recorded]
        record["real_from"] = [str(f) for f in args.real_from]
        args.out.mkdir(parents=True, exist_ok=True)
    else:
        trace, config, record, real = validate_live(args)
        summaries, frames = [r.summary for r in real], [r.requests for r in real]
        runs = [args.out / f"real-{i + 1}" for i in range(len(frames))]
    sim = run_sim(args, trace, config)
    attribution = attribute(trace, config, sim.summary, runs, frames, summaries)
    comparison = compare(summaries, sim.summary)
    comparison["ttft_parts"] = ttft_parts(frames, sim.requests)
    comparison["regime"] = regimes(frames, sim.requests)
    comparison["placement"] = placement(frames, sim.requests)
    comparison["run"] = record | {
        "profile": args.profile,
        "sim_config": config.to_dict(),
        "command": command_line(args),
    }
    write_validation(args, comparison, attribution, real, sim)
    return 0


def write_validation(
    args: argparse.Namespace,
    comparison: dict[str, Any],
    attribution: dict[str, Any],
    real: list[RunResult] | None,
    sim: RunResult,
) -> None:
    """``comparison.json``, ``attribution.json`` (where there is one), the report of a live
    validation, and the printed tables."""
    comparison["attribution"] = {
        "file": ATTRIBUTION_NAME if "runs" in attribution else None,
        "note": attribution.get("note"),
    }
    (args.out / "comparison.json").write_text(json.dumps(json_safe(comparison), indent=2) + "\n")
    if "runs" in attribution:
        text = json.dumps(json_safe(attribution), indent=2) + "\n"
        (args.out / ATTRIBUTION_NAME).write_text(text)
    if real is not None and not args.no_report:
        from lab.validate.report import write_validation_report

        plotlyjs = PlotlyJs(args.plotlyjs, args.out)
        write_validation_report(args.out, comparison, real, sim, attribution, plotlyjs)
    print(format_comparison(comparison))
    if comparison.get("placement") is not None:
        print("\n" + format_placement(comparison["placement"]))
    print("\n" + format_attribution(attribution))
    print(f"\noutputs in {args.out}/")


def live_inputs(args: argparse.Namespace) -> tuple[ServerInfo, Trace, SimConfig, dict[str, Any]]:
    """The server, its trace slice, the simulator's config and the run record so far."""
    from lab.bench.server import server_info

    info = server_info(args.url)
    num_pages = args.num_pages or info.kv_pages_total
    if num_pages is None:
        raise ValueError(f"{info.url} does not report its KV pages; give --num-pages")
    config = sim_config(args, info, num_pages)
    trace, dropped = servable(
        load_trace(args.trace, rate_scale=args.rate_scale, limit=args.limit), info.max_model_len
    )
    if not trace.requests:
        raise ValueError(f"no request of {args.trace} fits the server's context")
    if dropped:
        print(f"left out {dropped} requests longer than the server's context", file=sys.stderr)
    for warning in (hardware_warning(info.hardware, args.profile), sharing_warning(info, config)):
        if warning:
            print(warning, file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "trace": trace.describe(),
        "dropped_requests": dropped,
        "url": info.url,
        "server_model": info.model,
        "server_hardware": info.hardware,
        "profile_hardware": read_profile(args.profile).provenance.get("hardware"),
        "repeats": args.repeats,
    }
    return info, trace, config, record


def validate_live(
    args: argparse.Namespace,
) -> tuple[Trace, SimConfig, dict[str, Any], list[RunResult]]:
    """The server's trace slice, the simulator's config, the run record and the real runs."""
    info, trace, config, record = live_inputs(args)
    real = run_real(args, trace, info)
    record["loadavg_1min"] = [r.summary["bench"]["loadavg_1min"] for r in real]
    return trace, config, record, real


def validate_capacity(args: argparse.Namespace) -> int:
    """``--capacity``: both capacities and their error in ``capacity.json``."""
    if args.url is None:
        raise ValueError("--capacity measures a live server: give --url")
    info, trace, config, record = live_inputs(args)
    answer = run_capacity(args, trace, config, info)
    answer["run"] = record | {
        "profile": args.profile,
        "sim_config": config.to_dict(),
        "command": command_line(args),
    }
    (args.out / "capacity.json").write_text(json.dumps(json_safe(answer), indent=2) + "\n")
    print(format_capacity(answer))
    print(f"\noutputs in {args.out}/")
    return 0
