"""Admission control and timeouts: a full queue is a 429 with Retry-After, admitted requests
still finish whole, and a request past ``--request-timeout`` is aborted with 504."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Server, running_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from serving_load import Stream, stream_completion, wait_idle

pytestmark = pytest.mark.slow

MAX_QUEUED = 2


@pytest.fixture(scope="module")
def busy_server(model_ready: str) -> Iterator[Server]:
    # one request runs at a time, two may wait for their first token; anything else is refused
    args = ("--max-running", "1", "--max-queued", str(MAX_QUEUED), "--request-timeout", "8")
    with running_server(*args, cpu_threads=2) as s:
        yield s


def test_a_full_queue_refuses_with_retry_after_and_admitted_requests_finish(
    busy_server: Server,
) -> None:
    body = {"prompt": "Count:", "max_tokens": 10, "ignore_eos": True, "temperature": 0}

    async def burst() -> tuple[Stream, list[Stream]]:
        async with httpx.AsyncClient(base_url=busy_server.url, timeout=60) as client:
            alone = await stream_completion(client, body)
            return alone, list(
                await asyncio.gather(*(stream_completion(client, body) for _ in range(8)))
            )

    alone, outs = asyncio.run(burst())
    admitted = [o for o in outs if o.status == 200]
    refused = [o for o in outs if o.status == 429]
    assert len(admitted) + len(refused) == len(outs)
    assert MAX_QUEUED <= len(admitted) < len(outs)
    for o in admitted:
        assert o.done and o.finish == "length" and not o.error and o.text == alone.text
    for o in refused:
        assert o.retry_after is not None and 1 <= int(o.retry_after) <= 60
        assert "--max-queued" in (o.error or "")
    m = wait_idle(busy_server.url)
    assert m['engine_requests_rejected_total{reason="queue_full"}'] >= len(refused)
    assert m["engine_kv_pages_held"] == 0
    assert "Traceback" not in busy_server.log()


def test_a_request_past_its_timeout_is_aborted_with_504(busy_server: Server) -> None:
    long = {"prompt": "Write forever:", "max_tokens": 4000, "ignore_eos": True}
    before = wait_idle(busy_server.url)
    start = time.monotonic()

    async def both() -> tuple[Stream, httpx.Response]:
        async with httpx.AsyncClient(base_url=busy_server.url, timeout=60) as client:
            streamed = asyncio.ensure_future(stream_completion(client, long))
            await asyncio.sleep(1.5)  # the stream runs; the plain request waits behind it
            plain = await client.post("/v1/completions", json=long)
            return await streamed, plain

    streamed, plain = asyncio.run(both())
    assert 7.0 < time.monotonic() - start < 30.0
    assert plain.status_code == 504 and plain.json()["error"]["code"] == "timeout"
    if streamed.status == 200:  # cut mid-stream: an error event, then [DONE]
        assert streamed.chunk_times and streamed.done
        assert "--request-timeout" in (streamed.error or "")
    else:  # still queued when its time ran out (a slow machine)
        assert streamed.status == 504
    after = wait_idle(busy_server.url)
    assert after["engine_requests_timed_out_total"] - before["engine_requests_timed_out_total"] == 2
    assert after["engine_kv_pages_held"] == 0 and after["engine_num_requests_running"] == 0
    assert "Traceback" not in busy_server.log()
