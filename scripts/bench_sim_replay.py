"""Time a whole-trace ``sim replay`` and show where the time goes.

Usage: ``.venv/bin/python scripts/bench_sim_replay.py [TRACE] [--profile] [--report]``

Prints the wall time of each phase (load, simulate, write CSV/JSON, HTML
report), simulated requests per wall second, and with ``--profile`` the top of
a cProfile of the simulation phase, sorted by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

from sim.config import build_config
from sim.replay import run_replay, write_outputs
from sim.traces import load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default="traces/azure_conv.csv")
    parser.add_argument("--profile", action="store_true", help="cProfile the simulation phase")
    parser.add_argument("--report", action="store_true", help="also write report.html")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, help="output directory (default: a temporary one)")
    args = parser.parse_args()

    t0 = time.perf_counter()
    trace = load_trace(args.trace)
    config = build_config()
    t1 = time.perf_counter()
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    result = run_replay(trace, config, progress=False)
    if profiler is not None:
        profiler.disable()
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        write_outputs(result, args.out or Path(tmp), report=args.report)
    t3 = time.perf_counter()

    n = len(trace.requests)
    print(f"trace          {args.trace}: {n} requests over {trace.duration_s:.0f} s")
    print(f"steps          {result.summary['num_steps']} "
          f"({result.summary['fast_forward']['steps_in_runs']} in "
          f"{result.summary['fast_forward']['runs']} fast-forwarded runs)")  # fmt: skip
    print(f"load           {t1 - t0:6.2f} s")
    print(f"simulate       {t2 - t1:6.2f} s{' (under cProfile)' if profiler else ''}")
    print(f"write outputs  {t3 - t2:6.2f} s{' (with report.html)' if args.report else ''}")
    print(f"total          {t3 - t0:6.2f} s wall, {n / (t3 - t0):,.0f} simulated requests/s")
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())
    sys.stdout.flush()


if __name__ == "__main__":
    main()
