"""``engine bench``'s client (``lab.bench.client.send``) against a small aiohttp server, and the
HTTP side's own latency (``benchmarks/client_overhead.py``: the real frontend app fed by a
stand-in engine)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pandas as pd
import pytest
from aiohttp import web

from lab.bench.client import RequestRecord, Target, send
from lab.bench.load import READ_BUFFER
from schema.traces.record import TraceRequest

ROOT = Path(__file__).resolve().parents[1]
LONG = 1_000_000  # bytes of one final chunk: over the 512 KiB line aiohttp takes by default


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body["max_tokens"] > 100:
        return web.Response(status=400, text="too many tokens")
    reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await reply.prepare(request)
    for i in range(body["max_tokens"]):
        chunk = {"choices": [{"index": 0, "text": f" t{i}"}]}
        await reply.write(f"data: {json.dumps(chunk)}\n\n".encode())
    final = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]},
             "meta_info": {"token_times": [0.5] * (LONG // 5)}}  # fmt: skip
    await reply.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
    return reply


async def exchange(max_tokens: int, read_bufsize: int = READ_BUFFER) -> RequestRecord:
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        target = Target(f"http://127.0.0.1:{port}", "m", meta_info=True)
        request = TraceRequest("r", 0.0, 4, max_tokens)
        async with aiohttp.ClientSession(read_bufsize=read_bufsize) as client:
            return await send(client, target, request, "hi", 0.0)
    finally:
        await runner.cleanup()


def test_a_stream_is_timed_chunk_by_chunk_and_a_long_final_chunk_is_read() -> None:
    record = asyncio.run(exchange(5))
    assert record.status == "completed", record.reason
    assert len(record.chunk_times) == 5 and record.chunk_times == sorted(record.chunk_times)
    assert record.usage == {"completion_tokens": 5}
    assert len(record.meta["token_times"]) == LONG // 5


def test_a_line_over_the_buffer_fails_the_request_not_the_benchmark() -> None:
    record = asyncio.run(exchange(5, read_bufsize=1 << 16))
    assert record.status == "failed" and "LineTooLong" in record.reason


def test_a_refused_request_is_rejected_with_the_server_s_reason() -> None:
    record = asyncio.run(exchange(500))
    assert record.status == "rejected" and record.reason == "HTTP 400: too many tokens"
    assert not record.chunk_times


@pytest.mark.slow
def test_the_http_side_alone_streams_every_request(tmp_path: Path) -> None:
    """The real frontend, a stand-in engine, ``engine bench``: every request completes, the
    server's loop lag is sampled, and the percentiles are printed."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "client_overhead.py"),
         str(ROOT / "traces" / "azure_conv.csv"), "--limit", "20", "--rate-scale", "4",
         "--step-ms", "5", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "20 requests" in done.stdout and "server loop lag" in done.stdout
    requests = pd.read_csv(tmp_path / "bench" / "requests.csv")
    assert len(requests) == 20 and (requests["status"] == "completed").all()
    assert (requests["frontend_ms"] > 0).all() and (requests["ttft_ms"] > 0).all()
    assert (tmp_path / "loop_lag.csv").stat().st_size > 0
    assert not (tmp_path / "loop_lag.stop").exists()
