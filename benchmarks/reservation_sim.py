"""Benchmark (not a test): admission's decode reservation (the new-token ratio) on replays that
overload KV memory, with and without overlap scheduling. Writes the rows to ``OUT.json`` and
prints them as a markdown table.

    python benchmarks/reservation_sim.py --out reports/reservation/sim
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

from schema.traces import load_trace
from sim.config import build_config
from sim.replay import run_replay


def measure(trace: Any, num_pages: int, overlap: bool, reserve: bool) -> dict[str, Any]:
    config = build_config(num_pages=num_pages, overlap=overlap, reserve_decode=reserve)
    result = run_replay(trace, config, progress=False)
    s, req, steps = result.summary, result.requests, result.steps
    done = req[req["status"] == "completed"]
    return {
        "num_pages": num_pages,
        "overlap": overlap,
        "reserve_decode": reserve,
        "completed": s["completed"],
        "preemptions": int(req["num_preemptions"].sum()),
        "preempted_requests": int((req["num_preemptions"] > 0).sum()),
        "prefill_tokens": int(steps["prefill_tokens"].sum()),
        "input_tokens": int(done["input_tokens"].sum()),
        "duration_s": s["duration_s"],
        "output_throughput": s["output_throughput"],
        "request_throughput": s["request_throughput"],
        "ttft_p50_ms": s["ttft_ms"]["p50"],
        "ttft_p99_ms": s["ttft_ms"]["p99"],
        "tpot_p50_ms": s["tpot_ms"]["p50"],
        "tpot_p99_ms": s["tpot_ms"]["p99"],
        "wall_s": s["wall_s"],
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| KV pages | overlap | reserve | preemptions (requests) | prefill tokens / input "
        "| duration (s) | output tok/s | TTFT p50 / p99 (s) | TPOT p50 / p99 (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['num_pages']} | {'on' if r['overlap'] else 'off'} "
            f"| {'on' if r['reserve_decode'] else 'off'} "
            f"| {r['preemptions']} ({r['preempted_requests']}) "
            f"| {r['prefill_tokens'] / r['input_tokens']:.2f} | {r['duration_s']:.1f} "
            f"| {r['output_throughput']:,.0f} "
            f"| {r['ttft_p50_ms'] / 1e3:.1f} / {r['ttft_p99_ms'] / 1e3:.1f} "
            f"| {r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", default="traces/azure_conv.csv")
    ap.add_argument("--limit", type=int, default=4000)
    ap.add_argument("--rate-scale", type=float, default=4.0)
    ap.add_argument("--num-pages", type=int, nargs="+", default=[1500, 3000])
    ap.add_argument("--out", type=Path, required=True, help="path without suffix")
    args = ap.parse_args()

    trace = load_trace(args.trace, limit=args.limit, rate_scale=args.rate_scale)
    rows = [
        measure(trace, pages, overlap, reserve)
        for pages in args.num_pages
        for overlap in (False, True)
        for reserve in (False, True)
    ]
    cmd = "python " + " ".join(sys.argv)
    setup = {
        "trace": args.trace,
        "limit": args.limit,
        "rate_scale": args.rate_scale,
        "model": build_config().model,
        "command": cmd,
        "python": platform.python_version(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"setup": setup, "rows": rows}, indent=2))
    text = "\n".join(table(rows)) + "\n"
    print(text)


if __name__ == "__main__":
    main()
