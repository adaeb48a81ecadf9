"""Many streams at once, and a client that walks away mid-stream."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx
import pytest
from conftest import MODEL, Server

pytestmark = pytest.mark.slow

PROMPTS = [
    f"{subject} is" for subject in (
        "The sun", "A cat", "Python", "The ocean", "Music", "A good book", "Winter", "Paris",
        "The moon", "Coffee", "A forest", "Mathematics", "The internet", "Rain", "A bicycle",
        "Chess",
    )
]  # fmt: skip


async def stream_completion(
    client: httpx.AsyncClient, prompt: str, max_tokens: int
) -> tuple[str, str]:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    text, finish = [], None
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text.append(choice["text"])
            finish = choice["finish_reason"] or finish
    assert finish is not None
    return "".join(text), finish


def test_16_concurrent_streams_match_serving_alone(server: Server) -> None:
    async def run() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            alone = [await stream_completion(client, p, 10) for p in PROMPTS]
            together = await asyncio.gather(*(stream_completion(client, p, 10) for p in PROMPTS))
        return alone, list(together)

    alone, together = asyncio.run(run())
    assert together == alone
    assert all(text for text, _ in together)


def wait_for(
    server: Server, condition: str, check: Callable[[dict[str, float]], bool], timeout: float = 30.0
) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if check(m):
            return m
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {condition}: {m}")
        time.sleep(0.1)


def test_disconnect_mid_stream_aborts_and_frees_pages(server: Server) -> None:
    idle = wait_for(server, "an idle server", lambda m: m["engine_num_requests_running"] == 0)
    baseline = idle["engine_kv_pages_held"]
    aborted_before = idle["engine_requests_aborted_total"]
    body = {
        "model": MODEL,
        "prompt": "Write a very long story about a dragon.",
        "max_tokens": 2000,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(base_url=server.url, timeout=60) as client,
        client.stream("POST", "/v1/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        lines = resp.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
            if got >= 3:
                break
        running = server.metrics()
        assert running["engine_num_requests_running"] == 1
        assert running["engine_kv_pages_held"] > baseline
    # the connection is closed: only an abort ends 2000 tokens within 20 s on CPU
    after = wait_for(
        server,
        "the aborted request's pages to be released",
        lambda m: m["engine_num_requests_running"] == 0 and m["engine_kv_pages_held"] == baseline,
        timeout=20,
    )
    assert after["engine_requests_aborted_total"] == aborted_before + 1
    assert after["engine_generation_tokens_total"] - idle["engine_generation_tokens_total"] < 200
    # and the server still serves
    ok = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60
    )
    assert ok.status_code == 200
    assert "Traceback" not in server.log()


def test_disconnect_while_waiting_for_a_non_streamed_answer_aborts(server: Server) -> None:
    idle = wait_for(server, "an idle server", lambda m: m["engine_num_requests_running"] == 0)
    body = {"prompt": "Count to a thousand:", "max_tokens": 2000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=1.5)
    wait_for(
        server,
        "the abandoned request to be aborted",
        lambda m: (
            m["engine_requests_aborted_total"] == idle["engine_requests_aborted_total"] + 1
            and m["engine_num_requests_running"] == 0
            and m["engine_kv_pages_held"] == idle["engine_kv_pages_held"]
        ),
        timeout=20,
    )
    assert "Traceback" not in server.log()
