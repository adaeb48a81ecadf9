"""What `engine router` adds to TTFT, against a direct connection to the same server.

One SmolLM2 `engine serve` on CPU and one `engine router` in front of it. The
same one-token streamed completion is sent in turn directly and through the
router (the order alternates each round, one request at a time), and the time
to the first SSE event is recorded for each; the router's own CPU time over
the measured rounds comes from /proc. Writes ``reports/cluster/router_overhead.json``.

    python scripts/bench_router_overhead.py --rounds 200
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from serving_load import served, write_runs

BODY = {"prompt": "The capital of France is", "max_tokens": 1, "stream": True}
WARMUP_ROUNDS = 5


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def first_event_ms(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    with client.stream("POST", f"{url}/v1/completions", json=BODY) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                return (time.perf_counter() - start) * 1e3
    raise RuntimeError(f"{url} sent no event")


def measure(server_url: str, rounds: int, policy: str) -> dict[str, object]:
    cmd = [
        sys.executable, "-m", "lab.cli.engine", "router", "--worker", server_url,
        "--port", "0", "--policy", policy, "--log-level", "warning",
    ]  # fmt: skip
    router = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert router.stdout is not None
        router_url = router.stdout.readline().rsplit(" at ", 1)[1].strip()
        ttft: dict[str, list[float]] = {"direct": [], "router": []}
        cpu0 = 0.0
        with httpx.Client(timeout=60) as client:
            for i in range(rounds + WARMUP_ROUNDS):
                if i == WARMUP_ROUNDS:
                    cpu0 = cpu_seconds(router.pid)
                order = [("direct", server_url), ("router", router_url)]
                for name, url in order if i % 2 else order[::-1]:
                    ms = first_event_ms(client, url)
                    if i >= WARMUP_ROUNDS:
                        ttft[name].append(ms)
        cpu = cpu_seconds(router.pid) - cpu0
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(30)
    paired = [r - d for r, d in zip(ttft["router"], ttft["direct"], strict=True)]
    return {
        "rounds": rounds,
        "policy": policy,
        "ttft_p50_ms": {k: statistics.median(v) for k, v in ttft.items()},
        "ttft_p90_ms": {k: statistics.quantiles(v, n=10)[-1] for k, v in ttft.items()},
        "added_ttft_p50_ms": statistics.median(ttft["router"]) - statistics.median(ttft["direct"]),
        "paired_difference_p50_ms": statistics.median(paired),
        "router_cpu_ms_per_request": 1e3 * cpu / rounds,
        "router_saturation_estimate_rps": rounds / cpu if cpu > 0 else None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--policy", default="cache_aware")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("reports/cluster/router_overhead.json"))
    args = p.parse_args()
    runs = []
    with served("--num-pages", "256", threads=1) as (_, url):
        for _ in range(args.repeats):
            runs.append(measure(url, args.rounds, args.policy))
            print(json.dumps(runs[-1]), file=sys.stderr)
    write_runs(args.out, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
