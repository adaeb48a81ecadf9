"""Time ``sim replay`` on a whole trace: side by side against a baseline commit, or by phase.

Side by side (the speed figures of ``reports/sim_speed/``)::

    .venv/bin/python benchmarks/sim_replay.py --baseline 30566dd --repeats 3 \\
        --extra=--no-report --extra=--profile=profiles/h200_llama-3.1-8b.csv \\
        --json reports/sim_speed/hour_same_profile.json

exports the baseline commit with ``git archive`` into a temporary folder, then
runs the whole command ``python -m lab.cli.sim replay TRACE --out DIR``
(``sim.cli`` in trees from before the layers) of the baseline and of this
working tree alternately (same interpreter, same packages), ``--repeats``
times each, and records each run's wall time and peak resident memory (the
child's ``ru_maxrss``). Speed is the ratio of medians measured in this one
run, since the machine's speed varies from run to run.
The two ``requests.csv`` files must have the same rows, statuses and token
counts; whether their times agree within ``TIME_TOLERANCE_S`` is recorded
(``times_agree``: they do not when the default CPU costs changed in between).

By phase (``--phases``, in-process): load, simulate, write outputs, with
``--profile`` the top of a cProfile of the simulation phase.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
TIME_TOLERANCE_S = 1e-9
"""Per-request times of the two versions may differ by float rounding only."""


def export_commit(rev: str, dest: Path) -> str:
    """The tree of ``rev`` under ``dest`` (read from git's objects; no checkout touched)."""
    sha = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, check=True, text=True,
                         capture_output=True).stdout.strip()  # fmt: skip
    archive = subprocess.run(["git", "archive", "--format=tar", sha], cwd=ROOT, check=True,
                             capture_output=True).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return sha


def sim_module(tree: Path) -> str:
    """The module of the ``sim`` command in ``tree`` (``sim.cli`` before it moved to ``lab``)."""
    return "lab.cli.sim" if (tree / "lab" / "cli" / "sim.py").is_file() else "sim.cli"


def timed_replay(tree: Path, trace: Path, out: Path, extra: list[str]) -> dict[str, float]:
    """Run the tree's whole ``sim replay`` command; its wall time and peak RSS."""
    cmd = [sys.executable, "-m", sim_module(tree), "replay", str(trace), "--out", str(out),
           "--no-progress", *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} (in {tree}) failed")
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": usage.ru_maxrss / 1024}


ADDED_COLUMNS = ("replica",)
"""Columns a baseline from before they were added lacks (compared when both have them)."""


def compare_requests(a: Path, b: Path) -> dict[str, Any]:
    """Check that two ``requests.csv`` agree; the largest time difference per column."""
    x, y = pd.read_csv(a), pd.read_csv(b)
    added = [c for c in ADDED_COLUMNS if (c in x.columns) != (c in y.columns)]
    x, y = x.drop(columns=added, errors="ignore"), y.drop(columns=added, errors="ignore")
    if list(x.columns) != list(y.columns) or len(x) != len(y):
        raise SystemExit(f"{a} and {b} differ in columns or rows")
    diffs: dict[str, float] = {}
    for col in x.columns:
        u, v = x[col].to_numpy(), y[col].to_numpy()
        if x[col].dtype.kind == "f":
            both = np.isnan(u) & np.isnan(v)
            if (np.isnan(u) != np.isnan(v)).any():
                raise SystemExit(f"{col}: missing values differ")
            diffs[col] = float(np.max(np.abs(u[~both] - v[~both]), initial=0.0))
        elif not (x[col].fillna("") == y[col].fillna("")).all():
            raise SystemExit(f"{col} differs between {a} and {b}")
    worst = max((d for c, d in diffs.items() if not c.endswith("_ms")), default=0.0)
    return {"rows": len(x), "times_agree": worst <= TIME_TOLERANCE_S, "max_abs_diff": diffs}


def side_by_side(args: argparse.Namespace) -> None:
    trace = Path(args.trace).resolve()
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sha = export_commit(args.baseline, tmp / "baseline")
        trees = {"baseline": tmp / "baseline", "current": ROOT}
        load_before = os.getloadavg()
        for r in range(args.repeats):
            for name, tree in trees.items():
                result = timed_replay(tree, trace, tmp / f"{name}{r}", args.extra)
                runs[name].append(result)
                print(f"{name:9} run {r + 1}: {result['wall_s']:6.2f} s wall, "
                      f"{result['cpu_s']:6.2f} s CPU, "
                      f"{result['peak_rss_mb']:6.0f} MB peak", flush=True)  # fmt: skip
        load_after = os.getloadavg()
        agreement = compare_requests(tmp / "baseline0" / "requests.csv",
                                     tmp / "current0" / "requests.csv")  # fmt: skip
        outputs = {n: sorted(p.name for p in (tmp / f"{n}0").iterdir()) for n in trees}
    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "peak_rss_mb")}
           for n, rs in runs.items()}  # fmt: skip
    speedup = med["baseline"]["wall_s"] / med["current"]["wall_s"]
    cpu_speedup = med["baseline"]["cpu_s"] / med["current"]["cpu_s"]
    base, cur = med["baseline"], med["current"]
    print(f"median wall: baseline {base['wall_s']:.2f} s, current {cur['wall_s']:.2f} s: "
          f"{speedup:.2f}x faster ({cpu_speedup:.2f}x in CPU time); peak RSS "
          f"{base['peak_rss_mb']:.0f} -> {cur['peak_rss_mb']:.0f} MB")  # fmt: skip
    same = "agree" if agreement["times_agree"] else f"differ beyond {TIME_TOLERANCE_S} s in time"
    print(f"requests.csv {same} ({agreement['rows']} rows, same statuses and token counts); "
          f"load {load_before} -> {load_after}")  # fmt: skip
    if args.json:
        described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                                   text=True, capture_output=True)  # fmt: skip
        machine = {"python": platform.python_version(), "cpus": os.cpu_count(),
                   "loadavg_before": load_before, "loadavg_after": load_after}  # fmt: skip
        record = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "replay_command": f"python -m lab.cli.sim replay {args.trace} --out DIR --no-progress "
            + " ".join(args.extra),
            "baseline": {"rev": args.baseline, "sha": sha},
            "current": described.stdout.strip(),
            "machine": machine,
            "runs": runs,
            "median": med,
            "speedup": speedup,
            "cpu_speedup": cpu_speedup,
            "outputs": outputs,
            "requests_agree": agreement,
        }
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


def phases(args: argparse.Namespace) -> None:
    from lab.outputs import write_outputs
    from schema.traces import load_trace
    from sim.config import build_config
    from sim.replay import run_replay

    t0 = time.perf_counter()
    trace = load_trace(args.trace)
    t1 = time.perf_counter()
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    result = run_replay(trace, build_config(), progress=False)
    if profiler is not None:
        profiler.disable()
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        write_outputs(result, Path(tmp), report=args.report)
    t3 = time.perf_counter()
    ff = result.summary["fast_forward"]
    print(f"trace          {args.trace}: {len(trace.requests)} requests")
    print(f"steps          {result.summary['num_steps']} ({ff['steps_in_runs']} in "
          f"{ff['runs']} fast-forwarded runs)")  # fmt: skip
    print(f"load {t1 - t0:.2f} s, simulate {t2 - t1:.2f} s, write {t3 - t2:.2f} s"
          f"{' (under cProfile)' if profiler else ''}")  # fmt: skip
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("trace", nargs="?", default="traces/azure_conv.csv")
    parser.add_argument("--baseline", help="commit to compare against, side by side")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the side-by-side record here")
    parser.add_argument(
        "--extra",
        nargs="*",
        action="extend",
        default=[],
        help="more `sim replay` arguments, each as --extra=ARG (repeatable)",
    )
    parser.add_argument("--phases", action="store_true", help="time the phases in-process")
    parser.add_argument("--profile", action="store_true", help="cProfile the simulation phase")
    parser.add_argument("--report", action="store_true", help="phases: also write report.html")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    if args.baseline:
        side_by_side(args)
    else:
        phases(args)


if __name__ == "__main__":
    main()
