"""What `engine router` adds to TTFT, against a direct connection to the same server.

One `engine serve` on CPU and one `engine router` in front of it; every request is
the same one-token streamed completion, and its TTFT is the time to the first SSE
event. Two modes:

- one at a time (the default): the request is sent directly and through the router
  in turn (the order alternates each round);
- open loop (``--rate R [R ...]``): for ``--duration`` seconds, Poisson arrivals at
  R requests/s through the router and R/s directly, interleaved (each arrival of one
  Poisson stream at 2R goes one way or the other by a coin flip), none waiting for
  another; added TTFT at P50 and P90, and what arrived late or failed.

Either way the router's own CPU time over the measured requests comes from /proc
(its health checks included). ``--baseline-root DIR`` also measures the router of
another checkout of this repository (e.g. an older commit's worktree) against the
same server, in alternating runs. Writes ``reports/cluster/router_overhead.json``.

    python benchmarks/router_overhead.py --rounds 200
    python benchmarks/router_overhead.py --model tiny-llama --dummy-weights \\
        --rate 200 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import httpx
from serving_load import MODEL, served, write_runs

BODY = {"prompt": "The capital of France is", "max_tokens": 1, "stream": True}
WARMUP_ROUNDS = 5
WARMUP_S = 2.0
REPO = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


@contextmanager
def router(server_url: str, policy: str, root: Path) -> Iterator[tuple[int, str]]:
    """``engine router`` of the checkout at ``root`` in front of ``server_url``: (pid, URL)."""
    cmd = [
        sys.executable, "-m", "lab.cli.engine", "router", "--worker", server_url,
        "--port", "0", "--policy", policy, "--log-level", "warning",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, cwd=root, env=env
    )
    try:
        assert proc.stdout is not None
        yield proc.pid, proc.stdout.readline().rsplit(" at ", 1)[1].strip()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            print(
                f"engine router ({root}) did not stop in 30 s of SIGTERM: killed", file=sys.stderr
            )
            proc.kill()
            proc.wait()


def first_event_ms(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    with client.stream("POST", f"{url}/v1/completions", json=BODY) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                return (time.perf_counter() - start) * 1e3
    raise RuntimeError(f"{url} sent no event")


def one_at_a_time(server_url: str, router_url: str, pid: int, rounds: int) -> dict[str, object]:
    ttft: dict[str, list[float]] = {"direct": [], "router": []}
    cpu0 = 0.0
    with httpx.Client(timeout=60) as client:
        for i in range(rounds + WARMUP_ROUNDS):
            if i == WARMUP_ROUNDS:
                cpu0 = cpu_seconds(pid)
            order = [("direct", server_url), ("router", router_url)]
            for name, url in order if i % 2 else order[::-1]:
                ms = first_event_ms(client, url)
                if i >= WARMUP_ROUNDS:
                    ttft[name].append(ms)
    cpu = cpu_seconds(pid) - cpu0
    paired = [r - d for r, d in zip(ttft["router"], ttft["direct"], strict=True)]
    return {
        "rounds": rounds,
        **summary(ttft),
        "paired_difference_p50_ms": statistics.median(paired),
        **cpu_figures(cpu, rounds),
    }


def summary(ttft: dict[str, list[float]]) -> dict[str, object]:
    p50 = {k: statistics.median(v) for k, v in ttft.items()}
    p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in ttft.items()}
    return {
        "ttft_p50_ms": p50,
        "ttft_p90_ms": p90,
        "added_ttft_p50_ms": p50["router"] - p50["direct"],
        "added_ttft_p90_ms": p90["router"] - p90["direct"],
    }


def cpu_figures(cpu: float, requests: int) -> dict[str, object]:
    return {
        "router_cpu_ms_per_request": 1e3 * cpu / requests,
        "router_requests_per_cpu_second": requests / cpu if cpu > 0 else None,
    }


async def timed(session: aiohttp.ClientSession, url: str) -> float | None:
    """TTFT in ms of one streamed completion (read to its end), or None if it failed."""
    start = time.perf_counter()
    ttft = None
    try:
        async with session.post(f"{url}/v1/completions", json=BODY) as reply:
            async for line in reply.content:
                if ttft is None and line.startswith(b"data: "):
                    ttft = (time.perf_counter() - start) * 1e3
    except aiohttp.ClientError:
        return None
    return ttft


async def poisson(
    session: aiohttp.ClientSession, urls: dict[str, str], rate: float, duration: float, seed: int
) -> tuple[dict[str, list[float | None]], float]:
    """Send for ``duration`` s, at ``rate`` per second to each of ``urls``, interleaved at
    random; each path's TTFTs in order of sending, and the latest send behind its schedule."""
    rng = random.Random(seed)
    names = sorted(urls)
    sent: list[tuple[str, asyncio.Task[float | None]]] = []
    start = time.perf_counter()
    at = late = 0.0
    while True:
        at += rng.expovariate(rate * len(urls))
        if at >= duration:
            break
        wait = start + at - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        late = max(late, -wait)
        name = rng.choice(names)
        sent.append((name, asyncio.create_task(timed(session, urls[name]))))
    results = await asyncio.gather(*(task for _, task in sent))
    out: dict[str, list[float | None]] = {name: [] for name in names}
    for (name, _), ttft in zip(sent, results, strict=True):
        out[name].append(ttft)
    return out, late


async def open_loop_run(
    server_url: str, router_url: str, pid: int, rate: float, duration: float, seed: int
) -> dict[str, object]:
    urls = {"direct": server_url, "router": router_url}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await poisson(session, urls, rate, WARMUP_S, seed + 1)
        cpu0 = cpu_seconds(pid)
        ttfts, late = await poisson(session, urls, rate, duration, seed)
        cpu = cpu_seconds(pid) - cpu0
    ok = {k: [t for t in v if t is not None] for k, v in ttfts.items()}
    through_router = len(ttfts["router"])
    return {
        "rate_per_path": rate,
        "duration_s": duration,
        "requests": {k: len(v) for k, v in ttfts.items()},
        "failed": {k: len(v) - len(ok[k]) for k, v in ttfts.items()},
        "latest_send_behind_schedule_ms": 1e3 * late,
        **summary(ok),
        **cpu_figures(cpu, through_router),
    }


def git_commit(root: Path) -> str:
    """The commit checked out at ``root`` (``+`` when its tracked files other than the
    reports, which this benchmark writes, differ from it)."""
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    dirty = subprocess.run(
        ["git", "-C", str(root), "diff", "--quiet", "HEAD", "--", ".", ":!reports"]
    ).returncode
    return head + ("+" if dirty else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200, help="one at a time: rounds of two")
    p.add_argument("--rate", type=float, nargs="+", help="open loop: requests/s on each path")
    p.add_argument("--duration", type=float, default=20.0, help="open loop: seconds a run")
    p.add_argument("--policy", default="cache_aware")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--dummy-weights", action="store_true")
    p.add_argument("--baseline-root", type=Path, help="also measure this checkout's router")
    p.add_argument("--out", type=Path, default=Path("reports/cluster/router_overhead.json"))
    args = p.parse_args()
    roots = {"this": REPO} | (
        {"baseline": args.baseline_root.resolve()} if args.baseline_root else {}
    )
    serve_args = ["--num-pages", "256", *(["--dummy-weights"] if args.dummy_weights else [])]
    runs = []
    with served(*serve_args, threads=1, model=args.model) as (_, url):
        for repeat in range(args.repeats):
            for rate in args.rate or [None]:
                order = list(roots.items())
                for label, root in order if repeat % 2 == 0 else order[::-1]:
                    with router(url, args.policy, root) as (pid, router_url):
                        if rate is None:
                            run = one_at_a_time(url, router_url, pid, args.rounds)
                        else:
                            run = asyncio.run(
                                open_loop_run(url, router_url, pid, rate, args.duration, repeat)
                            )
                    commit = git_commit(root)
                    runs.append({"router": label, "commit": commit, "policy": args.policy, **run})
                    print(json.dumps(runs[-1]), file=sys.stderr)
                    write_runs(args.out, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
