"""A run's intake as one event loop that also streams every token would serve it.

    python scripts/frontend_shared_loop.py RUN/real-1 --cpu-profile HOST_CPU.csv

The engine's frontend is one asyncio event loop: it parses each request (the
profile's ``frontend`` cost) and writes every token's SSE chunk of every open
stream (``stream`` per chunk). This serves a run's own arrivals
(``requests.csv``) and steps (``steps.csv``: each step's chunks, one per request
it served, ``batch_size``, leaving the engine when it ends, ``time +
duration_s``) through the simulator's frontend with the loop
(``sim.model.frontend.FrontQueue``, ``frontend_loop``), and prints the intake's
time (wait and parse) at P50, P90 and P99 beside the run's measured
``frontend_ms`` and beside the profile's intake alone (the simulator without
the loop: two separate queues), and the share of the loop that streaming takes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.base import CpuCosts
from sim.costs.profile import ProfileError, cpu_costs_from, read_profile
from sim.model.frontend import FrontQueue

QUANTILES = (50, 90, 99)


def shared_loop_intake(
    arrivals: np.ndarray, step_ends: np.ndarray, chunks: np.ndarray, cpu: CpuCosts
) -> np.ndarray:
    """Per request (in the order of ``arrivals``): seconds from its arrival until the
    frontend's loop, streaming each step's ``chunks`` (given as they end), has parsed it."""
    front = FrontQueue(cpu, 1, loop=True)
    for end, n in sorted(zip(step_ends.tolist(), chunks.tolist(), strict=True)):
        front.stream((end,), int(n))
    intake = np.empty(len(arrivals))
    for i in np.argsort(arrivals, kind="stable"):
        intake[i] = front.enter(float(arrivals[i]), 0)[0] - arrivals[i]
    return intake


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a run's folder (requests.csv and steps.csv)")
    p.add_argument("--cpu-profile", required=True, help="a profile with CPU stage costs")
    args = p.parse_args(argv)
    try:
        cpu = cpu_costs_from(read_profile(args.cpu_profile))
        requests = pd.read_csv(args.run / "requests.csv")
        steps = pd.read_csv(args.run / "steps.csv")
    except (OSError, ProfileError, ValueError) as exc:
        print(f"frontend_shared_loop: error: {exc}", file=sys.stderr)
        return 2
    ends = (steps["time"] + steps["duration_s"]).to_numpy(np.float64)
    chunks = steps["batch_size"].to_numpy(np.float64)
    intake = shared_loop_intake(requests["arrival"].to_numpy(np.float64), ends, chunks, cpu)
    span = float(ends.max() - ends.min()) if len(ends) > 1 else float("nan")
    print(f"{len(requests)} requests, {int(chunks.sum())} chunks over {span:.1f} s: streaming "
          f"takes {chunks.sum() * cpu.stream / span:.1%} of the loop")  # fmt: skip
    print(f"{'intake ms':<34}" + "".join(f"{'P' + str(q):>9}" for q in QUANTILES))
    rows = [
        ("measured (frontend_ms)", requests["frontend_ms"].to_numpy(np.float64)),
        ("one loop, streaming beside", intake * 1e3),
        ("the profile's intake alone", np.full(len(requests), cpu.frontend * 1e3)),
    ]
    for name, values in rows:
        print(f"{name:<34}" + "".join(f"{v:>9.1f}" for v in np.nanpercentile(values, QUANTILES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
