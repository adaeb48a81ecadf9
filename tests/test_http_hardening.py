"""The HTTP edge: text that is not Unicode, bodies past ``--max-request-bytes``, clients that
leave mid-body, and one log format for every line the server writes.

Each case is a client's fault: it gets a 4xx (or nothing, if it left) and the server's log
gets at most one INFO line for it, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from conftest import Server, running_server

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/generate"


@pytest.fixture(scope="module")
def edge_server(model_ready: str) -> Iterator[Server]:
    args = ("--max-model-len", "48", "--num-pages", "64")
    with running_server(*args, cpu_threads=2) as s:
        yield s


def post_raw(server: Server, path: str, body: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=60)


LONE = "a\ud800b"  # json.dumps spells it "a\\ud800b": valid JSON, not valid Unicode
HI = [{"role": "user", "content": "hi"}]
SURROGATE_CASES = [
    ("chat content", CHAT, {"messages": [{"role": "user", "content": LONE}]}, "messages.0.content"),
    (
        "chat content part",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
        "messages.0.content.0.text",
    ),
    ("chat stop", CHAT, {"messages": HI, "stop": ["x", LONE]}, "stop.1"),
    ("chat user", CHAT, {"messages": HI, "user": LONE}, "user"),
    ("prompt", COMPLETIONS, {"prompt": LONE}, "prompt"),
    ("prompt list", COMPLETIONS, {"prompt": [LONE]}, "prompt.0"),
    ("completion stop", COMPLETIONS, {"prompt": "hi", "stop": LONE}, "stop"),
    ("generate text", GENERATE, {"text": LONE}, "text"),
    (
        "generate stop",
        GENERATE,
        {"text": "hi", "sampling_params": {"stop": [LONE]}},
        "sampling_params.stop.0",
    ),
    ("field name", COMPLETIONS, {"prompt": "hi", "x\udc00": 1}, "x\\udc00"),
]


@pytest.mark.parametrize(
    ("path", "body", "param"), [c[1:] for c in SURROGATE_CASES], ids=[c[0] for c in SURROGATE_CASES]
)
def test_a_lone_surrogate_is_a_400_naming_the_field(
    edge_server: Server, path: str, body: dict[str, object], param: str
) -> None:
    resp = post_raw(edge_server, path, json.dumps(body).encode())
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    assert "surrogate" in error["message"], error


def test_a_surrogate_encoded_as_utf8_bytes_is_a_400(edge_server: Server) -> None:
    # ED A0 80 is U+D800 written as UTF-8 bytes, which Python's json reads back as a surrogate
    resp = post_raw(edge_server, COMPLETIONS, b'{"prompt": "a\xed\xa0\x80"}')
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "prompt"


def test_a_paired_surrogate_is_an_ordinary_character(edge_server: Server) -> None:
    body = b'{"prompt": "smile \\ud83d\\ude00", "max_tokens": 2}'
    assert post_raw(edge_server, COMPLETIONS, body).status_code == 200


def test_a_number_too_long_to_read_is_a_400(edge_server: Server) -> None:
    body = b'{"prompt": "hi", "max_tokens": %s}' % (b"9" * 5000)
    resp = post_raw(edge_server, COMPLETIONS, body)
    assert resp.status_code == 400, resp.text
    assert "digits" in resp.json()["error"]["message"]
