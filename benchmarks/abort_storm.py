"""Abort storm: thousands of streamed requests, a random half of which disconnect.

Each request streams a greedy completion of one of a few prompts (EOS ignored,
so a whole answer has exactly ``--max-tokens`` tokens). An aborting client
closes its connection at a random point: before the response starts, or after
a random number of chunks. Afterwards the server must hold no KV page for any
request (``engine_kv_pages_held`` 0), have nothing running, waiting or open,
still be healthy, and every stream that completed must equal the greedy
answer of a run of the same prompt that nobody aborted. Writes
``reports/robustness/abort_storm.{md,json}``.

    python benchmarks/abort_storm.py --requests 2000 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from serving_load import Stream, served, stream_completion, tree_rss_mib, wait_idle

PROMPTS = [f"Tell me fact number {i} about the sea." for i in range(16)]


@dataclass
class StormResult:
    requests: int
    aborted: int
    completed: int
    wrong: int  # completed streams whose text or ending differ from the reference
    failed: int  # streams that were neither aborted nor completed
    wall_s: float
    abort_points: dict[str, int]


def body(prompt: str, max_tokens: int) -> dict[str, object]:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


async def reference(url: str, prompts: list[str], max_tokens: int) -> dict[str, str]:
    """The greedy answer to each prompt, one request at a time, nothing aborted."""
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        return {p: (await stream_completion(client, body(p, max_tokens))).text for p in prompts}


async def one(
    client: httpx.AsyncClient, prompt: str, max_tokens: int, cut: int | None, delay: float
) -> Stream | None:
    """A client that reads the whole stream (``cut`` None), leaves before the response
    starts (``cut`` -1, after ``delay`` s) or after ``cut`` chunks; None when it left."""
    request = stream_completion(client, body(prompt, max_tokens), stop_after=cut)
    if cut is None:
        return await request
    if cut < 0:
        task = asyncio.ensure_future(request)
        await asyncio.sleep(delay)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return None
        return None
    await request
    return None


async def storm(
    url: str,
    expected: dict[str, str],
    requests: int,
    concurrency: int,
    max_tokens: int,
    seed: int = 0,
) -> StormResult:
    """Run the storm on the prompts of ``expected``; half the clients (at random) abort at a
    random point."""
    rng = random.Random(seed)
    prompts = sorted(expected)
    plan = []
    for _ in range(requests):
        cut = None if rng.random() < 0.5 else rng.randint(-1, max_tokens - 1)
        plan.append((rng.choice(prompts), cut, rng.uniform(0.0, 0.5)))
    limit = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 8)

    async def guarded(client: httpx.AsyncClient, item: tuple[str, int | None, float]) -> object:
        async with limit:
            return await one(client, item[0], max_tokens, item[1], item[2])

    start = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        outs = await asyncio.gather(*(guarded(client, item) for item in plan))
    wall = time.monotonic() - start
    completed = wrong = failed = 0
    for (prompt, cut, _), out in zip(plan, outs, strict=True):
        if cut is not None:
            continue
        assert isinstance(out, Stream)
        if out.status != 200 or not out.done or out.error:
            failed += 1
        else:
            completed += 1
            wrong += out.text != expected[prompt] or out.finish != "length"
    points = Counter(
        "complete" if cut is None else "before response" if cut < 0 else f"after {cut} chunks"
        for _, cut, _ in plan
    )
    aborted = sum(cut is not None for _, cut, _ in plan)
    return StormResult(requests, aborted, completed, wrong, failed, wall, dict(points))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--num-pages", type=int, default=96, help="small: forces preemption")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="reports/robustness/abort_storm")
    args = parser.parse_args()
    server_args = ("--num-pages", str(args.num_pages), "--max-running", str(args.concurrency))
    with served(*server_args, threads=args.threads) as (proc, url):
        expected = asyncio.run(reference(url, PROMPTS, args.max_tokens))
        before = wait_idle(url)
        rss_before = tree_rss_mib(proc.pid)
        result = asyncio.run(
            storm(url, expected, args.requests, args.concurrency, args.max_tokens, args.seed)
        )
        after = wait_idle(url)
        rss_after = tree_rss_mib(proc.pid)
        healthy = httpx.get(f"{url}/health", timeout=10).status_code == 200
    keys = (
        "engine_kv_pages_held", "engine_num_requests_running", "engine_num_requests_waiting",
        "engine_num_requests_open", "engine_requests_aborted_total", "engine_num_preemptions_total",
    )  # fmt: skip
    report = {
        "command": "python " + shlex.join(sys.argv),
        "result": asdict(result),
        "metrics_after": {k: after[k] for k in keys},
        "aborted_counted": after["engine_requests_aborted_total"]
        - before["engine_requests_aborted_total"],
        "rss_mib": {"before": round(rss_before), "after": round(rss_after)},
        "healthy_after": healthy,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    ok = (
        result.wrong == 0
        and result.failed == 0
        and after["engine_kv_pages_held"] == 0
        and after["engine_num_requests_open"] == 0
        and healthy
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
