"""A KV pool too small for the batch: requests are preempted, recomputed, and still exact."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from conftest import Server, running_server

pytestmark = pytest.mark.slow

PROMPTS = [f"Story number {i}: once upon a time" for i in range(6)]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def small_server(model_ready: str) -> Iterator[Server]:
    # 10 pages x 16 tokens hold about 3 of the 6 requests at full length
    with running_server("--num-pages", "10", "--page-size", "16") as s:
        yield s


async def generate(client: httpx.AsyncClient, prompt: str) -> list[int]:
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
    }
    resp = await client.post("/generate", json=body)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["output_ids"])


async def generate_all(server: Server, concurrent: bool) -> list[list[int]]:
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
        if concurrent:
            return list(await asyncio.gather(*(generate(client, p) for p in PROMPTS)))
        return [await generate(client, p) for p in PROMPTS]


def test_preempted_requests_finish_with_the_same_tokens(
    small_server: Server, server: Server
) -> None:
    reference = asyncio.run(generate_all(server, concurrent=False))
    squeezed = asyncio.run(generate_all(small_server, concurrent=True))
    assert squeezed == reference
    assert "preempted" in small_server.log()


def test_a_request_larger_than_the_pool_is_rejected(small_server: Server) -> None:
    body = {"text": "hi " * 300, "sampling_params": {"max_new_tokens": 8}}
    resp = httpx.post(f"{small_server.url}/generate", json=body, timeout=60)
    assert resp.status_code == 400
    assert "KV pages" in resp.json()["error"]["message"]
