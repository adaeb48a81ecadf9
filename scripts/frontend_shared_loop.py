"""A run's intake as one event loop that also streams every token would serve it.

    python scripts/frontend_shared_loop.py RUN/real-1 --cpu-profile HOST_CPU.csv

The engine's frontend is one asyncio event loop: it parses each request (the
profile's ``frontend`` cost) and writes every token's SSE chunk of every open
stream (``stream`` per chunk). The simulator serves the two in separate FIFO
queues, so its intake never waits behind streaming. This serves both in one
FIFO, in time order: each request's intake at its arrival (``requests.csv``)
and each step's chunks, one per request it served (``batch_size``), when the
step ends (``steps.csv``: ``time + duration_s``; the detokenizer's hop before
the frontend left out). It prints the intake's time (wait and parse) at P50,
P90 and P99 beside the run's measured ``frontend_ms`` and beside the profile's
intake alone, and the share of the loop that streaming takes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.profile import ProfileError, cpu_costs_from, read_profile

QUANTILES = (50, 90, 99)


def shared_loop_intake(
    arrivals: np.ndarray,
    frontend_s: float,
    chunk_times: np.ndarray,
    chunks: np.ndarray,
    stream_s: float,
) -> np.ndarray:
    """Per request (in the order of ``arrivals``): seconds from its arrival until the loop
    has parsed it, the loop serving intakes (``frontend_s`` each) and each time's ``chunks``
    (``stream_s`` each) first come, first served; at equal times the chunks go first."""
    jobs = sorted(
        [(float(t), 0, float(n) * stream_s, -1) for t, n in zip(chunk_times, chunks, strict=True)]
        + [(float(t), 1, frontend_s, i) for i, t in enumerate(arrivals)]
    )
    done = np.empty(len(arrivals))
    free = -np.inf
    for t, _, cost, i in jobs:
        free = max(t, free) + cost
        if i >= 0:
            done[i] = free - t
    return done


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
    intake = shared_loop_intake(
        requests["arrival"].to_numpy(np.float64), cpu.frontend, ends, chunks, cpu.stream
    )
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
