"""Overload: offer 10x the engine's capacity and see what admission control does.

For each server configuration (bounded: ``--max-queued`` and
``--request-timeout``; unbounded: neither), first the capacity of that server:
``--concurrency`` closed-loop clients for ``--seconds`` (completed requests per
second, measured right before, so a change in the machine's load between the
two runs does not skew the offered load). Then Poisson arrivals at
``--factor`` times that rate for ``--seconds``; every request
streams ``--max-tokens`` tokens (EOS ignored) and a client gives up after
``--client-timeout`` s. Recorded: how many were admitted, refused (429 with
Retry-After) or timed out, whether every admitted one finished whole, their
latencies, and the peak memory of the server's process tree. Writes
``reports/robustness/overload.json``.

    python benchmarks/overload.py --seconds 30 --factor 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from serving_load import (
    Stream,
    parse_flags,
    scrape,
    served,
    stream_completion,
    tree_rss_mib,
    wait_idle,
)

PROMPTS = [f"Item {i}: describe a colour." for i in range(32)]


@dataclass
class Outcome:
    status: int  # 0: the client gave up
    start: float
    end: float
    stream: Stream | None = None


@dataclass
class Sampler:
    """Peaks of the server's memory (its process tree) and of the requests it holds open
    and has waiting, sampled from a thread."""

    pid: int
    url: str
    peak_mib: float = 0.0
    peak_open: float = 0.0
    peak_waiting: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.peak_mib = max(self.peak_mib, tree_rss_mib(self.pid))
            m = scrape(self.url)
            self.peak_open = max(self.peak_open, m["engine_num_requests_open"])
            self.peak_waiting = max(self.peak_waiting, m["engine_num_requests_waiting"])


def body(rng: random.Random, max_tokens: int) -> dict[str, object]:
    return {"prompt": rng.choice(PROMPTS), "max_tokens": max_tokens, "ignore_eos": True}


async def capacity(url: str, concurrency: int, seconds: float, max_tokens: int) -> float:
    """Completed requests per second with ``concurrency`` clients always waiting."""
    rng = random.Random(1)
    done = 0
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def loop() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                out = await stream_completion(client, body(rng, max_tokens))
                done += out.status == 200 and out.done

        start = time.monotonic()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return done / (time.monotonic() - start)


async def offer(
    url: str, rate: float, seconds: float, max_tokens: int, client_timeout: float
) -> list[Outcome]:
    """Poisson arrivals at ``rate`` per second for ``seconds``; every outcome."""
    rng = random.Random(2)
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=client_timeout, limits=limits) as client:

        async def one(request: dict[str, object]) -> None:
            start = time.monotonic()
            try:
                out = await asyncio.wait_for(stream_completion(client, request), client_timeout)
                outcomes.append(Outcome(out.status, start, time.monotonic(), out))
            except (TimeoutError, httpx.HTTPError):
                outcomes.append(Outcome(0, start, time.monotonic()))

        tasks = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tasks.append(asyncio.create_task(one(body(rng, max_tokens))))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    return outcomes


def pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100)[q - 1], 3)


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    ok = [o for o in outcomes if o.status == 200 and o.stream and o.stream.done]
    whole = [o for o in ok if o.stream and not o.stream.error and o.stream.finish == "length"]
    refused = [o for o in outcomes if o.status == 429]
    retry = [int(o.stream.retry_after) for o in refused if o.stream and o.stream.retry_after]
    ttft = [o.stream.chunk_times[0] - o.start for o in whole if o.stream and o.stream.chunk_times]
    e2e = [o.end - o.start for o in whole]
    return {
        "offered": len(outcomes),
        "admitted": sum(o.status == 200 for o in outcomes),
        "finished_whole": len(whole),
        "cut_by_server_timeout": len(ok) - len(whole),
        "refused_429": len(refused),
        "refused_503": sum(o.status == 503 for o in outcomes),
        "server_timeout_504": sum(o.status == 504 for o in outcomes),
        "client_gave_up": sum(o.status == 0 for o in outcomes),
        "retry_after_s": {"min": min(retry, default=None), "max": max(retry, default=None)},
        "ttft_s": {"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
        "e2e_s": {"p50": pct(e2e, 50), "p99": pct(e2e, 99)},
        "refused_in_ms": {"p50": pct([(o.end - o.start) * 1000 for o in refused], 50)},
    }


def run(args: argparse.Namespace, server_args: tuple[str, ...]) -> dict[str, Any]:
    with served(*server_args, threads=args.threads) as (proc, url):
        asyncio.run(capacity(url, 2, 2.0, 4))  # warm up
        cap = asyncio.run(capacity(url, args.concurrency, args.seconds, args.max_tokens))
        rate = cap * args.factor
        wait_idle(url)
        idle_mib = tree_rss_mib(proc.pid)
        sampler = Sampler(proc.pid, url)
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        start = time.monotonic()
        outcomes = asyncio.run(offer(url, rate, args.seconds, args.max_tokens, args.client_timeout))
        wall = time.monotonic() - start
        after = wait_idle(url, timeout=120)
        sampler.stop.set()
        thread.join()
        healthy = httpx.get(f"{url}/health", timeout=10).status_code == 200
    summary = {"capacity_rps": round(cap, 2), "offered_rps": round(rate, 2)}
    summary |= summarize(outcomes)
    summary |= {
        "server_args": list(server_args),
        "wall_s": round(wall, 1),
        "served_rps": round(summary["finished_whole"] / wall, 2),
        "rss_mib": {"idle": round(idle_mib), "peak": round(sampler.peak_mib)},
        "peak_open_requests": sampler.peak_open,
        "peak_waiting_in_scheduler": sampler.peak_waiting,
        "kv_pages_held_after": after["engine_kv_pages_held"],
        "healthy_after": healthy,
    }
    return summary


def main() -> int:
    args = parse_flags(
        __doc__.splitlines()[0], seconds=20.0, factor=10.0, concurrency=16, max_tokens=8,
        max_queued=16, request_timeout=100.0, client_timeout=150.0, threads=2,
        out="reports/robustness/overload.json",
    )  # fmt: skip
    running = ("--max-running", str(args.concurrency))
    bounded = (
        *running, "--max-queued", str(args.max_queued),
        "--request-timeout", str(args.request_timeout),
    )  # fmt: skip
    report = {
        "command": "python " + shlex.join(sys.argv),
        "bounded": run(args, bounded),
        "unbounded": run(args, running),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
