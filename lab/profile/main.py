"""``engine profile``: measure the serving code path and write a profile for the simulator.

Runner flags are ``engine serve``'s own (parsed by its parser and turned into
``RunnerArgs`` by the same functions), so a profile measures what serving runs
with the same flags. The profile's flags bound the work: the grid, the
repeats, and ``--max-seconds`` for the step grid.
"""

from __future__ import annotations

import argparse
import csv
import logging
import random
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from engine.ipc.config import ServeConfig
from engine.models.setup import ModelNotFoundError
from engine.runner.hardware import hardware
from lab.profile import provenance
from lab.profile.copies import measure_copies
from lab.profile.grid import GridSpec, StepPoint, ints
from lab.profile.recorded import (
    COMPARISON_COLUMNS,
    RecordedStep,
    comparison_rows,
    recorded_steps,
    summary,
)
from lab.profile.stages import measure_stages
from lab.profile.steps import StepTimer, serving_runner
from lab.profile.transfer import measure_transfer
from schema.steprecord import read_step_record
from sim.costs.profile import (
    STEP_KINDS,
    UNIT_KINDS,
    Profile,
    ProfileError,
    ProfileRow,
    display_path,
    read_profile,
    write_profile,
)
from sim.costs.table import TableCostModel

GRID_FLAGS = (
    ("prefill-tokens", "prefill tokens per step (pure prefill)"),
    ("prefill-prefixes", "cached prefix before each prefill chunk"),
    ("prefill-chunks", "requests the prefill tokens are split over"),
    ("decode-batches", "decode batch sizes"),
    ("decode-contexts", "context of each decoding request"),
    ("mixed-prefill", "prefill tokens of mixed steps"),
    ("mixed-batches", "decode requests of mixed steps"),
    ("mixed-prefixes", "cached prefix before the prefill chunk of mixed steps"),
    ("mixed-contexts", "context of each decoding request of mixed steps (uniform rows)"),
    (
        "ragged-longest",
        "context of the long request of ragged decode and mixed rows, the "
        "others at the shortest decode context (default: the longest decode context)",
    ),
    (
        "verify-drafts",
        "draft tokens of every decode slot of verify steps (speculative decoding), each crossed "
        "with the decode batches and contexts; without --num-draft-tokens, the longest is the "
        "runner's K, whose verify steps replay CUDA graphs as serving's do (default: none)",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="engine profile",
        description="Time batch plans on the serving runner and the CPU stages around it; "
        "write a profile CSV for `sim replay --profile`.",
        epilog="Every other option is engine serve's (--model, --tokenizer, --device, --tp, "
        "--dtype, --dummy-weights, --attention-backend, --no-cuda-graph, --num-pages, "
        "--page-size, --cpu-threads, --seed) and builds the same runner.",
    )
    p.add_argument("--out", type=Path, required=True, help="profile CSV to write")
    for flag, help_ in GRID_FLAGS:
        p.add_argument(f"--{flag}", type=ints, help=f"{help_}, comma-separated")
    p.add_argument("--holdout", type=int, help="random grid points kept out of the fit")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each plan")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each plan first")
    p.add_argument("--stage-repeats", type=int, default=5, help="repeats of each CPU stage")
    p.add_argument("--max-seconds", type=float, help="stop timing plans after this long")
    p.add_argument(
        "--scatter-pages",
        action="store_true",
        help="give each plan's sequences pages in a random order of the pool, as a serving "
        "pool leaves them (default: one sequence's pages after another's)",
    )
    p.add_argument(
        "--plans-from",
        type=Path,
        help="time the plans of a CUDA run's step record (engine_steps.csv) instead of the "
        "grid, and write OUT's stem + _vs_record.csv: each step's device time in the run "
        "beside the same plan's alone (lab/profile/recorded.py)",
    )
    p.add_argument(
        "--plans-per-kind",
        type=int,
        default=40,
        help="--plans-from: steps of each kind (mixed, decode, prefill), evenly spaced (40)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write over an existing profile measured on other hardware (refused by default)",
    )
    p.add_argument("--no-steps", action="store_true", help="CPU stage costs only")
    p.add_argument("--no-cpu-stages", action="store_true", help="step times only")
    return p


def serve_config(serve_argv: list[str], run_dir: str) -> ServeConfig:
    """The ``ServeConfig`` ``engine serve`` would build from ``serve_argv``."""
    from engine.launch.model_source import resolve_source
    from engine.launch.serve import build_parser as serve_parser
    from engine.launch.serve import make_config

    parser = serve_parser()
    parser.prog = "engine profile"
    args = parser.parse_args(serve_argv)
    source = resolve_source(args.model, args.tokenizer, args.dummy_weights)
    return make_config(args, source, Path(run_dir), port=0)


def grid_spec(args: argparse.Namespace, device: str) -> GridSpec:
    spec = GridSpec.default(device)
    given = {f.replace("-", "_"): getattr(args, f.replace("-", "_")) for f, _ in GRID_FLAGS}
    given["holdout"] = args.holdout
    values = {k: v for k, v in given.items() if v is not None}
    # mixed and ragged contexts follow the decode contexts given, unless given themselves
    derived = ("mixed_contexts", "ragged_longest")
    fields = {k: getattr(spec, k) for k in spec.__slots__ if k not in derived}
    return GridSpec(**{**fields, **values})


def measure_steps(
    cfg: ServeConfig,
    spec: GridSpec,
    args: argparse.Namespace,
    info: dict[str, str],
    recorded: list[RecordedStep],
) -> list[ProfileRow]:
    """Time the grid's plans, or those of the ``recorded`` steps (shuffled, so that
    ``--max-seconds`` cuts evenly), on the runner ``engine serve`` would build from ``cfg``,
    then the host tier's copies and the disaggregated KV transfer on its pool."""
    from engine.scheduler_proc.loop import runner_args

    rargs = runner_args(cfg)
    if spec.verify_drafts and not rargs.scheduler.num_draft_tokens:
        # verify steps of the longest draft replay CUDA graphs, as serving with that K runs them
        k = max(spec.verify_drafts)
        rargs = replace(rargs, scheduler=replace(rargs.scheduler, num_draft_tokens=k))
    with serving_runner(rargs) as leader:
        runner = leader.runner
        vocab = cfg.vocab_limit or cfg.vocab_size
        timer = StepTimer(
            leader, runner.page_size, runner.num_pages, vocab, spec.seed, args.scatter_pages
        )
        on_cuda = cfg.device.startswith("cuda")
        info["dtype"] = str(rargs.torch_dtype()).removeprefix("torch.")
        info["attention_backend"] = runner.backend_name
        info["cuda_graph"] = str(rargs.cuda_graph and on_cuda)
        info["num_pages"] = f"{runner.num_pages} of {runner.page_size} tokens"
        # shuffled, so that --max-seconds cuts every kind evenly
        random.Random(spec.seed).shuffle(recorded)
        points = [s.point() for s in recorded] if recorded else spec.points()
        fits = [timer.fits(p) for p in points]
        if not all(fits):
            print(f"left out {fits.count(False)} plans larger than the KV pool or a request",
                  file=sys.stderr)  # fmt: skip
        points = [p for p, fit in zip(points, fits, strict=True) if fit]
        recorded = [s for s, fit in zip(recorded, fits, strict=False) if fit]
        if not recorded:
            random.Random(spec.seed).shuffle(points)
        rows = run_points(timer, points, args)
        units = measure_copies(runner, args.repeats, info)
        units += measure_transfer(runner, args.repeats, info)
    if len(rows) < len(points):
        info["cut"] = f"--max-seconds {args.max_seconds}: timed {len(rows)} of {len(points)} plans"
    if recorded:
        vs_record(recorded, rows, timer.launches, runner.page_size, args.out)
    return rows + units


def vs_record(
    recorded: list[RecordedStep],
    rows: list[ProfileRow],
    launches: list[float | None],
    page_size: int,
    out: Path,
) -> None:
    """Write and print each recorded step's device and launch times in its run beside the
    times alone."""
    path = out.with_name(f"{out.stem}_vs_record.csv")
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COMPARISON_COLUMNS)
        writer.writerows(comparison_rows(recorded, rows, launches, page_size))
    print("\n".join(summary(recorded, rows, launches)))
    print(f"wrote {path}")


def run_points(
    timer: StepTimer, points: list[StepPoint], args: argparse.Namespace
) -> list[ProfileRow]:
    rows: list[ProfileRow] = []
    start = time.monotonic()
    for point in tqdm(points, desc="plans", unit="plan", file=sys.stderr, mininterval=1.0):
        if args.max_seconds is not None and time.monotonic() - start > args.max_seconds:
            print(f"--max-seconds {args.max_seconds} reached", file=sys.stderr)
            break
        rows.append(timer.run(point, args.repeats, args.warmup))
    return rows


def describe_grid(spec: GridSpec, args: argparse.Namespace) -> str:
    values = [(f, getattr(spec, f.replace("-", "_"))) for f, _ in GRID_FLAGS]
    parts = [f"{f}={','.join(map(str, v))}" for f, v in values if v]  # no verify: none shown
    pages = "scattered" if args.scatter_pages else "contiguous"
    return " ".join([*parts, f"holdout={spec.holdout}", f"repeats={args.repeats}",
                     f"warmup={args.warmup}", f"pages={pages}"])  # fmt: skip


def summary_lines(profile: Profile) -> list[str]:
    """What ``engine profile`` prints: the plans timed, the fit's errors, the CPU costs."""
    lines = [f"profile {profile.path}: {len(profile.steps)} step plans"]
    if "table_fit" in profile.provenance:
        lines.append(f"table fit: {profile.provenance['table_fit']}")
    lines += [f"  {k:<17}{v * 1e6:10.2f} us" for k, v in profile.cpu.items()]
    return lines


def overwrite_refusal(out: Path, here: str) -> str | None:
    """Why writing ``out`` would lose a profile of other hardware, or None when it would not."""
    if not out.is_file():
        return None
    try:
        there = read_profile(out).provenance.get("hardware", "")
    except ProfileError:
        return None
    if there == here:
        return None
    return (
        f"{out} holds a profile measured on {there!r}, not on this machine ({here!r}); "
        "write it elsewhere (e.g. --out out/profiles/NAME.csv) or pass --overwrite"
    )


def profile_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, serve_argv = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with tempfile.TemporaryDirectory() as run_dir:
        try:
            cfg = serve_config(serve_argv, run_dir)
        except (ModelNotFoundError, ValueError) as exc:
            parser.exit(2, f"engine profile: error: {exc}\n")
    if cfg.device == "cuda" and not args.no_steps and torch.cuda.device_count() < cfg.tp_size:
        parser.exit(2, f"engine profile: error: --tp {cfg.tp_size} needs as many CUDA devices, "
                    f"this machine has {torch.cuda.device_count()}\n")  # fmt: skip
    here = hardware(cfg.device, cfg.tp_size)
    refusal = overwrite_refusal(args.out, here)
    if refusal and not args.overwrite:
        parser.exit(2, f"engine profile: error: {refusal}\n")
    try:
        spec = grid_spec(args, cfg.device)
    except ValueError as exc:
        parser.exit(2, f"engine profile: error: {exc}\n")
    recorded: list[RecordedStep] = []
    if args.plans_from is not None:
        try:
            recorded = recorded_steps(read_step_record(args.plans_from), args.plans_per_kind)
        except (OSError, ValueError) as exc:
            parser.exit(2, f"engine profile: error: --plans-from: {exc}\n")
    info = {
        "hardware": here,
        "model": f"{cfg.model} ({'dummy weights' if cfg.dummy_weights else cfg.model_path})",
        "date": provenance.now(),
        "command": "engine profile " + shlex.join(argv),
        "device": cfg.device,
        "tp": str(cfg.tp_size),
        "software": provenance.versions(),
        "source": provenance.source_revision(),
    }
    rows: list[ProfileRow] = []
    if not args.no_steps:
        info["grid"] = (
            f"plans of {args.plans_from}, {args.plans_per_kind} a kind" if args.plans_from
            else describe_grid(spec, args)
        )  # fmt: skip
        rows += measure_steps(cfg, spec, args, info, recorded)
    if not args.no_cpu_stages:
        rows += measure_stages(cfg, args.stage_repeats, info)
    steps = [r for r in rows if r.kind in STEP_KINDS]
    cpu = {r.kind: r.duration_s for r in rows if r.kind in UNIT_KINDS}
    profile = Profile(display_path(args.out), info, steps, cpu)
    if steps:
        info["table_fit"] = TableCostModel(profile, cfg.tp_size).error_text()
    print("\n".join(summary_lines(profile)))
    write_profile(args.out, info, rows)
    print(f"wrote {args.out}")
    return 0
