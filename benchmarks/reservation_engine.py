"""The decode reservation in the real engine: preemptions with and without it, on this CPU.

Starts ``engine serve`` (SmolLM2-135M) with a KV pool too small for every
running request's full output, once with ``--no-reserve-decode`` and once with
``--reserve-decode``, in turn (``--repeats`` pairs), and sends each the same
``--requests`` streamed completions at once (EOS ignored, ``--max-tokens``
each). Recorded per run: the requests that ended whole, preemptions and
output tokens from the server's ``/metrics``, and the batch's wall time.
Writes ``reports/reservation/engine.json``.

    python benchmarks/reservation_engine.py --num-pages 96 --requests 24
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from serving_load import parse_flags, scrape, served, stream_completion, wait_idle, write_runs

PROMPT = "{i}: write a long story about the sea, the wind and a lighthouse keeper."


async def offer(url: str, n: int, max_tokens: int) -> list[bool]:
    """``n`` streamed completions at once; whether each ended whole (by length, no error)."""
    bodies = [
        {"prompt": PROMPT.format(i=i), "max_tokens": max_tokens, "ignore_eos": True}
        for i in range(n)
    ]
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        streams = await asyncio.gather(*(stream_completion(client, b) for b in bodies))
    return [s.finish == "length" and s.error is None and s.done for s in streams]


def one_run(args: argparse.Namespace, reserve: bool) -> dict[str, Any]:
    flag = "--reserve-decode" if reserve else "--no-reserve-decode"
    server_args = (
        "--num-pages", str(args.num_pages), "--max-running", str(args.max_running), flag,
    )  # fmt: skip
    with served(*server_args, threads=args.threads) as (_, url):
        before = scrape(url)
        start = time.perf_counter()
        ok = asyncio.run(offer(url, args.requests, args.max_tokens))
        wall = time.perf_counter() - start
        after = wait_idle(url)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    output = delta.get("engine_generation_tokens_total", 0.0)
    return {
        "reserve_decode": reserve,
        "completed_whole": sum(ok),
        "preemptions": delta.get("engine_num_preemptions_total", 0.0),
        "output_tokens": output,
        "wall_s": wall,
        "output_tok_per_s": output / wall,
    }


def main() -> int:
    args = parse_flags(
        __doc__.split("\n\n")[0], num_pages=96, max_running=16, requests=24, max_tokens=160,
        repeats=1, threads=2, out=Path("reports/reservation/engine.json"),
    )  # fmt: skip
    runs = []
    for _ in range(args.repeats):
        for reserve in (False, True):
            runs.append(one_run(args, reserve))
            print(json.dumps(runs[-1]), file=sys.stderr)
    write_runs(args.out, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
