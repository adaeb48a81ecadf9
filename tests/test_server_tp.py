"""``--tp 2`` (gloo on CPU) with ``--num-tokenizers 2`` serves the same greedy tokens as tp 1."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from conftest import Server, greedy_ids, running_server

pytestmark = pytest.mark.slow

PROMPTS = ["The quick brown fox", "In the beginning", "def fibonacci(n):", "Tea or coffee?"]


@pytest.fixture(scope="module")
def tp2_server(model_ready: str) -> Iterator[Server]:
    with running_server("--tp", "2", "--num-tokenizers", "2", "--num-pages", "256") as s:
        yield s


def test_tp2_matches_tp1_greedy(server: Server, tp2_server: Server) -> None:
    for prompt in PROMPTS:
        assert greedy_ids(tp2_server, prompt) == greedy_ids(server, prompt), prompt


def test_two_tokenizers_serve_chat_and_text(tp2_server: Server, server: Server) -> None:
    chat = {
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 6,
        "temperature": 0,
    }
    with httpx.Client(base_url=tp2_server.url, timeout=120) as client:
        outs = [client.post("/v1/chat/completions", json=chat).json() for _ in range(4)]
    texts = {o["choices"][0]["message"]["content"] for o in outs}
    assert len(texts) == 1  # round-robin: two requests went through each worker
    ref = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=120).json()
    assert texts == {ref["choices"][0]["message"]["content"]}
