"""GPU idle time between consecutive decode steps, with and without overlap scheduling.

Run on the GPU machine (after ``source scripts/gpu_env.sh``)::

    python3 benchmarks/gpu/overlap.py --out $OUT/overlap.json

The serving engine's step loop (``StepDriver.advance``: the real scheduler core, the
inputs, the runner's launch, completion) drives ``--batch`` requests of
``--prompt`` tokens that each generate ``--new`` tokens, once strictly
alternating and once overlapped (step N+1 launched before step N is finished).
Every step records CUDA timing events around its device work; over the steps
that are pure decode, the idle fraction is the GPU time between the end of one
step and the start of the next over the whole span. ``--device cpu --model
tiny-llama`` runs the same loop on CPU (no events: throughput only).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from core.scheduler import SchedulerConfig
from engine.ipc.messages import TokenizedRequest
from engine.runner import ModelRunner, RunnerArgs
from engine.sampling import SamplingParams
from engine.scheduler_proc.driver import Launched, StepDriver


def run(runner: ModelRunner, batch: int, prompt: int, new: int, overlap: bool) -> dict[str, Any]:
    config = SchedulerConfig(num_pages=runner.num_pages, max_running=batch)
    engine = StepDriver(config, runner.launch, [])
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_new_tokens=new)
    for i in range(batch):
        ids = [(13 * i + j) % 20000 + 1 for j in range(prompt)]
        engine.add(TokenizedRequest(f"r{i}", ids, params, 0.0, 0.0))
    runner.step_events = [] if runner.device.type == "cuda" else None
    decode_steps: list[int] = []
    in_flight: Launched | None = None
    steps = tokens = 0
    t0 = time.perf_counter()
    while engine.has_work() or in_flight is not None:
        items, in_flight, _ = engine.advance(in_flight, overlap)
        tokens += sum(len(item.token_ids) for item in items)
        plan = engine.last_plan
        if plan is not None and plan.has_model_work:
            if not plan.prefill and len(plan.decode) == batch:
                decode_steps.append(steps)
            steps += 1
    wall = time.perf_counter() - t0
    result: dict[str, Any] = {
        "batch": batch,
        "overlap": overlap,
        "steps": steps,
        "wall_s": wall,
        "output_tokens": tokens,
        "tokens_per_s": tokens / wall,
    }
    events = runner.step_events
    runner.step_events = None
    if events:
        torch.cuda.synchronize()
        busy = idle = 0.0
        for a, b in itertools.pairwise(decode_steps):
            if b != a + 1:
                continue
            start, end = events[a]
            busy += start.elapsed_time(end)
            idle += end.elapsed_time(events[b][0])
        result |= {
            "decode_pairs": len(decode_steps) - 1,
            "decode_busy_ms": busy,
            "decode_idle_ms": idle,
            "decode_idle_fraction": idle / (busy + idle) if busy + idle else None,
        }
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    pages = max(args.batch) * -(-(args.prompt + args.new) // 16) + 64
    runner = ModelRunner(
        RunnerArgs(
            model=args.model,
            dummy_weights=True,
            device=args.device,
            scheduler=SchedulerConfig(num_pages=pages, max_running=max(args.batch)),
        )
    )
    result: dict[str, Any] = {
        "command": " ".join(["python3", *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "model": args.model,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "runs": [],
    }
    for batch in args.batch:
        run(runner, batch, args.prompt, 8, overlap=True)  # warm-up
        for overlap in (False, True):
            row = run(runner, batch, args.prompt, args.new, overlap)
            print(json.dumps(row), flush=True)
            result["runs"].append(row)
            args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
