"""``engine router``'s client side against real (dummy-weight) servers: many open streams,
clients that go away, a worker that vanishes between health checks, a body too large.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import httpx
import pytest
from conftest import running_server
from test_engine_router import by_worker, outstanding, running_router

from engine.ipc.config import MAX_REQUEST_BYTES

pytestmark = pytest.mark.slow

TINY = "tiny-llama"
SHORT = {"model": TINY, "prompt": "The capital of France is", "max_tokens": 2}
OPEN_STREAMS = 120  # past httpx's default pool of 100 connections, which starved health checks


async def hold_streams(url: str, n: int, while_open: float) -> list[dict[str, str]]:
    """Open ``n`` long streams, read each one's first event, poll ``/health`` for
    ``while_open`` seconds, then drop every stream without reading the rest."""
    body = {**SHORT, "max_tokens": 1800, "ignore_eos": True, "stream": True}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        replies = await asyncio.gather(
            *(session.post(f"{url}/v1/completions", json=body) for _ in range(n))
        )
        for reply in replies:
            assert reply.status == 200
            assert (await reply.content.readline()).startswith(b"data: ")
        states = []
        deadline = time.monotonic() + while_open
        while time.monotonic() < deadline:
            async with session.get(f"{url}/health") as health:
                states.append((await health.json())["workers"])
            await asyncio.sleep(0.1)
        for reply in replies:
            reply.close()
    return states


def test_many_open_streams_leave_health_checks_alone_and_abort_when_dropped() -> None:
    with running_server("--dummy-weights", "--num-pages", "4096", model=TINY) as worker:
        checks = ("--health-interval", "0.2", "--health-timeout", "0.5", "--health-failures", "2")
        with running_router("--worker", worker.url, *checks) as (_, url):
            states = asyncio.run(hold_streams(url, OPEN_STREAMS, while_open=2.0))
            assert states and all(s == {worker.url: "healthy"} for s in states)
            deadline = time.monotonic() + 10
            while outstanding(url)[worker.url]:
                assert time.monotonic() < deadline, "dropped streams stayed open"
                time.sleep(0.05)
            aborted = by_worker(url, "router_requests_aborted_total")[worker.url]
            assert aborted == OPEN_STREAMS
            assert httpx.post(f"{url}/v1/completions", json=SHORT, timeout=30).status_code == 200


def test_a_worker_gone_between_health_checks_is_skipped_and_marked_dead() -> None:
    with (
        running_server("--dummy-weights", model=TINY) as kept,
        running_server("--dummy-weights", model=TINY) as gone,
    ):
        workers = ("--worker", gone.url, "--worker", kept.url, "--policy", "round_robin")
        with running_router(*workers, "--health-interval", "60") as (_, url):
            os.kill(gone.pid, signal.SIGKILL)
            gone.proc.wait(10)
            for _ in range(4):
                r = httpx.post(f"{url}/v1/completions", json=SHORT, timeout=30)
                assert r.status_code == 200, r.text
            assert httpx.get(f"{url}/health").json()["workers"][gone.url] == "dead"
            too_big = httpx.post(
                f"{url}/v1/completions", content=b" " * (MAX_REQUEST_BYTES + 1), timeout=30
            )
            assert too_big.status_code == 413 and too_big.json()["error"]["message"]
