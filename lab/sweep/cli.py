"""``sim sweep`` and ``sim capacity``: their flags and what they print and write."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pandas as pd

from core.router.policy import POLICIES
from lab.report.plotlyjs import PlotlyJs, add_plotlyjs_argument
from lab.sweep.capacity import arrival_rate, capacity_table, probes_table, search_capacity
from lab.sweep.executor import Executor, make_executor
from lab.sweep.grid import RATE_SCALE, check_grid, read_grid, swept
from lab.sweep.probes import RowCache, file_digest, run_probes
from lab.sweep.replicas import replicas_table, search_replicas
from lab.sweep.sweep import Plan, knob_effects, plan_grid, sweep_table, write_sweep
from schema.tables import write_csv, write_parquet
from schema.traces import Trace, load_trace
from sim.config import overlap_choice

TOP_ROWS = 5
"""Configurations printed after a sweep (best goodput first)."""


def _common_args(p: argparse.ArgumentParser, grid_required: bool) -> None:
    p.add_argument("trace", type=Path, help="a .jsonl (Mooncake fields) or Azure .csv trace")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--grid", type=Path, required=grid_required, help="TOML grid of knobs")
    add_plotlyjs_argument(p)
    p.add_argument("--config", type=Path, help="JSON or TOML config file (the grid's base)")
    p.add_argument("--limit", type=int, help="replay only the first N requests (by arrival)")
    p.add_argument("--jobs", type=int, help="local worker processes (default: all cores)")
    p.add_argument(
        "--ray", nargs="?", const="", metavar="ADDRESS",
        help="run on Ray: a local runtime, or the cluster at ADDRESS (pip install '.[cluster]')",
    )  # fmt: skip
    p.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="overlap scheduling where the grid does not set it (default: the config file's, "
        "else the loop the profile's engine runs: on for a profile measured on CUDA)",
    )
    p.add_argument("--no-cache", action="store_true", help="neither read nor write DIR/cache")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_sweep_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sweep", help="replay a trace under every configuration of a grid")
    _common_args(p, grid_required=True)
    p.add_argument("--slo-ttft-ms", type=float, help="goodput SLO on TTFT")
    p.add_argument("--slo-tpot-ms", type=float, help="goodput SLO on TPOT")
    p.set_defaults(func=cmd_sweep)


def add_capacity_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("capacity", help="highest rate within SLOs, per configuration")
    p.set_defaults(func=cmd_capacity)
    _common_args(p, grid_required=False)
    p.add_argument("--slo-ttft-ms", type=float, required=True, help="the SLO on TTFT")
    p.add_argument("--slo-tpot-ms", type=float, required=True, help="the SLO on TPOT")
    p.add_argument("--attainment", type=float, default=0.99,
                   help="fraction of requests that must meet both SLOs (default 0.99)")  # fmt: skip
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="stop once the bracket's ratio is 1 + this or less (0.02)")  # fmt: skip
    g = p.add_argument_group("replica search", "simulate clusters of N replicas behind the router")
    g.add_argument(
        "--replicas-search",
        action="store_true",
        help="find the fewest replicas that meet the SLOs by simulating the cluster",
    )
    g.add_argument("--max-replicas", type=int, default=64, help="give up above this (default 64)")
    g.add_argument(
        "--router",
        choices=sorted(POLICIES),
        help="the router's policy (default: the config's, else round robin)",
    )
    g.add_argument("--rate-scale", type=float, default=1.0,
                   help="the rate the replicas must serve, x the trace's (default 1)")  # fmt: skip


class _Run:
    """What both commands share: the grid's plan, the trace, the executor and the cache."""

    def __init__(self, args: argparse.Namespace, grid: dict[str, list[Any]]) -> None:
        self.out: Path = args.out
        self.trace: Trace = load_trace(args.trace, limit=args.limit)
        overrides = {
            "slo_ttft_ms": args.slo_ttft_ms,
            "slo_tpot_ms": args.slo_tpot_ms,
            "overlap": args.overlap,
        }
        self.plan: Plan = plan_grid(grid, args.trace, args.limit, args.config, overrides)
        self.cache = RowCache(None if args.no_cache else self.out / "cache")
        self.knobs = list(grid)
        self.executor: Executor = make_executor(args.ray, args.jobs)
        self.progress = not args.no_progress

    def subtitle(self, args: argparse.Namespace) -> str:
        slos = ", ".join(
            f"{name} <= {v:g} ms"
            for name, v in (("TTFT", args.slo_ttft_ms), ("TPOT", args.slo_tpot_ms))
            if v is not None
        )
        models = sorted({str(p.config.get("cost_model")) for p in self.plan.probes})
        return (
            f"trace {args.trace} ({len(self.trace.requests)} requests); "
            f"{len(self.plan.points)} configuration(s); SLOs: {slos or 'none'}; "
            f"cost model: {', '.join(models)}; overlap: {self.overlap()}; "
            f"executor: {self.executor.name}"
        )

    def overlap(self) -> str:
        """The scheduling loop of the configurations and why (``sim.config.overlap_choice``)."""
        loops = {
            overlap_choice(c["overlap"], c.get("overlap_by_default", False), c.get("profile"))
            for c in (p.config for p in self.plan.probes)
            if "overlap" in c
        }
        return "; ".join(sorted(loops)) or "-"


def cmd_sweep(args: argparse.Namespace) -> int:
    from lab.report.sweep_page import write_sweep_page

    grid = read_grid(args.grid)
    run = _Run(args, grid)
    try:
        rows = run_probes(run.plan.probes, run.trace, run.executor, run.cache,
                          progress=run.progress)  # fmt: skip
    finally:
        run.executor.close()
    table = sweep_table(run.plan, rows, run.knobs)
    write_sweep(run.out, table)
    effects = knob_effects(table, swept(grid))
    title = f"sim sweep: {args.trace.name}"
    write_sweep_page(
        run.out, title, run.subtitle(args), table, effects, run.knobs, PlotlyJs(args.plotlyjs)
    )
    print(f"overlap: {run.overlap()}")
    print(_sweep_summary(table, run.knobs))
    print(f"\noutputs in {run.out}/ (sweep.csv, sweep.parquet, sweep.html)")
    return 0 if (table["status"] == "ok").any() else 1


def _sweep_summary(table: pd.DataFrame, knobs: list[str]) -> str:
    ok = table[table["status"] == "ok"]
    lines = [f"{len(ok)} of {len(table)} configurations ran"]
    cols = ["config_id", *knobs, "goodput", "slo_attainment", "output_throughput",
            "ttft_ms_p90", "tpot_ms_p90", "binding_limit"]  # fmt: skip
    if len(ok):
        best = ok.sort_values("goodput", ascending=False).head(TOP_ROWS)[cols]
        lines += ["", "best goodput:", best.to_string(index=False, float_format="%.2f")]
    for _, row in table[table["status"] != "ok"].iterrows():
        lines.append(f"failed: config {row['config_id']}: {row['error']}")
    return "\n".join(lines)


def cmd_capacity(args: argparse.Namespace) -> int:
    from lab.report.capacity_page import write_capacity_page

    if not 0 < args.attainment <= 1 or not args.tolerance > 0:
        raise ValueError("--attainment must be in (0, 1] and --tolerance > 0")
    grid = read_grid(args.grid) if args.grid else check_grid({})
    if RATE_SCALE in grid:
        raise ValueError("sim capacity searches the rate scale: leave rate_scale out of the grid")
    if args.replicas_search and ("replicas" in grid or args.max_replicas < 1):
        raise ValueError("--replicas-search: leave replicas out of the grid; --max-replicas >= 1")
    run = _Run(args, grid)
    digest = file_digest(args.trace)
    try:
        searches = search_capacity(
            run.plan, run.trace, run.executor, run.cache, attainment=args.attainment,
            tolerance=args.tolerance, trace_digest=digest, progress=run.progress,
        )  # fmt: skip
        if args.replicas_search:
            found = search_replicas(
                searches, run.trace, run.executor, run.cache, rate_scale=args.rate_scale,
                max_replicas=args.max_replicas, router=args.router, attainment=args.attainment,
                trace_digest=digest, progress=run.progress,
            )  # fmt: skip
    finally:
        run.executor.close()
    rate = arrival_rate(run.trace)
    capacity = capacity_table(run.plan, searches, run.knobs, rate, args.attainment)
    probes = probes_table([s.rows for s in searches], args.attainment)
    run.out.mkdir(parents=True, exist_ok=True)
    replica_cols = []
    if args.replicas_search:
        capacity = capacity.merge(replicas_table(found, args.rate_scale), on="config_id")
        replica_probes = probes_table([r.rows for r in found], args.attainment, "replicas")
        write_csv(replica_probes, run.out / "replica_probes.csv")
        replica_cols = ["replicas_simulated", "replicas_simulated_note"]
    write_csv(capacity, run.out / "capacity.csv")
    write_parquet(capacity, run.out / "capacity.parquet")
    write_csv(probes, run.out / "probes.csv")
    subtitle = f"{run.subtitle(args)}; attainment >= {args.attainment:g}; trace rate "
    subtitle += f"{rate:.2f} req/s"
    write_capacity_page(run.out, f"sim capacity: {args.trace.name}", subtitle, capacity,
                        probes, run.knobs, args.attainment,
                        (args.slo_ttft_ms, args.slo_tpot_ms), PlotlyJs(args.plotlyjs))  # fmt: skip
    cols = ["config_id", *run.knobs, "max_rate_scale", "crossing_scale", "max_request_rate",
            "replicas_even_split", *replica_cols, "binding_limit_at_max",
            "binding_limit_above", "ttft_stage_above", "error"]  # fmt: skip
    print(f"trace rate {rate:.2f} req/s; SLO attainment >= {args.attainment:g}")
    print(f"overlap: {run.overlap()}")
    print(capacity[cols].to_string(index=False, float_format="%.3f"))
    extra = ", replica_probes.csv" if args.replicas_search else ""
    print(f"\noutputs in {run.out}/ (capacity.csv, capacity.parquet, probes.csv{extra}, "
          "capacity.html)")  # fmt: skip
    return 0 if (capacity["status"] == "ok").any() else 1
