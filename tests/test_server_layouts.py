"""``--layout frontend`` and ``--layout inline`` serve what ``split`` serves, token for token.

Each layout answers chat and completions, streamed or not, as the shared
``split`` server does with greedy sampling (a stop string included), reports
itself on the model card, and frees a request whose client leaves mid-stream.
``frontend`` runs with ``--dp 2``: the layouts combine with replicas (and TP).
Their faults are in ``test_faults.py``, the bad-input battery (``inline``) in
``test_server_errors.py``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Server, greedy_ids, running_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from serving_load import wait_idle

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
BODIES = [
    (CHAT, {"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 8}),
    (COMPLETIONS, {"prompt": "The capital of France is", "max_tokens": 8}),
    (COMPLETIONS, {"prompt": "Hello, my name is", "max_tokens": 8, "stop": [","]}),
]


@pytest.fixture(scope="module", params=["frontend", "inline"])
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def layout_server(layout: str, model_ready: str) -> Iterator[Server]:
    """A server of the layout, with the shared ``split`` server's other settings; ``frontend``
    with two replicas, whose schedulers its one tokenizer thread feeds."""
    replicas = ("--dp", "2") if layout == "frontend" else ()
    args = ("--layout", layout, "--num-pages", "1024", *replicas)
    with running_server(*args, cpu_threads=2) as s:
        yield s


def answer(server: Server, path: str, body: dict[str, Any], stream: bool) -> tuple[str, str]:
    """The text and finish reason of a greedy answer, streamed or not."""
    body = {**body, "temperature": 0, "stream": stream}
    chat = path == CHAT
    if not stream:
        resp = httpx.post(f"{server.url}{path}", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        return choice["message"]["content"] if chat else choice["text"], choice["finish_reason"]
    text, finish = "", ""
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += (choice["delta"].get("content") or "") if chat else choice["text"]
            finish = choice["finish_reason"] or finish
    return text, finish


def test_the_card_reports_the_layout(server: Server, layout_server: Server, layout: str) -> None:
    for s, name in ((server, "split"), (layout_server, layout)):
        assert httpx.get(f"{s.url}/v1/models", timeout=10).json()["data"][0]["layout"] == name


SPLIT: dict[tuple[int, bool], tuple[str, str]] = {}  # the split server's answers, asked once


@pytest.mark.parametrize("stream", [False, True])
def test_chat_and_completions_match_split(
    server: Server, layout_server: Server, stream: bool
) -> None:
    for i, (path, body) in enumerate(BODIES):
        if (i, stream) not in SPLIT:
            SPLIT[i, stream] = answer(server, path, body, stream)
        assert answer(layout_server, path, body, stream) == SPLIT[i, stream], (path, body)
    assert answer(layout_server, *BODIES[2], stream)[1] == "stop"
    prompt = "A short story about a robot:"
    assert greedy_ids(layout_server, prompt) == greedy_ids(server, prompt)


def test_a_client_that_leaves_mid_stream_frees_its_request(layout_server: Server) -> None:
    body = {"prompt": "Tell me a long story.", "max_tokens": 2000, "ignore_eos": True}
    with httpx.stream(
        "POST", f"{layout_server.url}{COMPLETIONS}", json={**body, "stream": True}, timeout=60
    ) as resp:
        events = 0
        for line in resp.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break  # leaving the block closes the connection mid-stream
    time.sleep(1.0)  # the frontend notices within its disconnect poll
    after = wait_idle(layout_server.url)
    assert after["engine_num_requests_running"] == 0
    assert after["engine_num_requests_open"] == 0
    assert after["engine_kv_pages_held"] == 0
    assert after["engine_requests_aborted_total"] >= 1
    assert "Traceback" not in layout_server.log()
