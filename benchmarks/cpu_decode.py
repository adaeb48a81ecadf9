"""CPU decode steps of SmolLM2-135M (bfloat16, one torch thread) on the serving runner.

    python benchmarks/cpu_decode.py --repeats 3 [--out FILE.json]

Times three pure-decode plans as ``engine profile`` times a step (``StepDriver``
inputs, ``TPLeader.launch``, tokens back on the host; median of ``--repeats``
after one warm-up): 48 requests with contexts drawn from 64-4,096 tokens
(seeded: the ragged batch of a loaded server), the same 48 at 1,024 tokens
each, and 8 ragged ones. Prints (and writes) each plan's median in ms, with the
``engine`` package it ran (run it with ``PYTHONPATH`` set to another checkout to
time that checkout's engine against this one's, in turn).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import engine
from core.scheduler import SchedulerConfig
from engine.models.setup import ensure_model
from engine.runner.args import RunnerArgs
from lab.profile.grid import StepPoint
from lab.profile.steps import StepTimer, serving_runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = str(ensure_model("smollm2-135m"))
    runner_args = RunnerArgs(
        model=model,
        device="cpu",
        dtype="bfloat16",
        cpu_threads=1,
        scheduler=SchedulerConfig(num_pages=8000, max_running=256),
    )
    rng = np.random.default_rng(7)
    points = {
        "ragged48": StepPoint((), tuple(int(x) for x in rng.integers(64, 4096, size=48))),
        "uniform48": StepPoint((), (1024,) * 48),
        "ragged8": StepPoint((), tuple(int(x) for x in rng.integers(64, 4096, size=8))),
    }
    result: dict[str, str | float] = {"engine": str(Path(engine.__file__).parent)}
    with serving_runner(runner_args) as leader:
        runner = leader.runner
        timer = StepTimer(leader, runner.page_size, runner.num_pages, vocab=1000)
        for name, point in points.items():
            result[f"{name}_ms"] = timer.run(point, repeats=args.repeats).duration_s * 1e3
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
