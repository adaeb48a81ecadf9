"""The HTTP edge: text that is not Unicode, bodies past ``--max-request-bytes``, clients that
leave mid-body, and one log format for every line the server writes.

Each case is a client's fault: it gets a 4xx (or nothing, if it left) and the server's log
gets at most one INFO line for it, never a traceback.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import Server, running_server

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/generate"
LIMIT = 65536
LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \w+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: "
)


@pytest.fixture(scope="module")
def edge_server(model_ready: str) -> Iterator[Server]:
    args = ("--max-request-bytes", str(LIMIT), "--max-model-len", "48", "--num-pages", "64")
    with running_server(*args, "--log-level", "debug", cpu_threads=2) as s:
        yield s


def post_raw(server: Server, path: str, body: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=60)


def address(server: Server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def read_status(sock: socket.socket) -> int:
    """The status code of the HTTP response arriving on ``sock``."""
    sock.settimeout(10)
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, f"the server closed the connection without answering: {head!r}"
        head += chunk
    return int(head.split(b" ", 2)[1])


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


def test_a_body_over_the_limit_is_a_413(edge_server: Server) -> None:
    resp = post_raw(edge_server, COMPLETIONS, b'{"prompt": "%s"}' % (b"a" * LIMIT))
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["code"] == "request_too_large"
    padded = b'{"prompt": "hi", "max_tokens": 2}'.ljust(LIMIT)
    assert post_raw(edge_server, COMPLETIONS, padded).status_code == 200


def test_a_413_comes_before_the_body_is_sent(edge_server: Server) -> None:
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {1 << 30}\r\n\r\n"
    )
    with socket.create_connection(address(edge_server)) as sock:
        sock.sendall(head.encode())
        assert read_status(sock) == 413


def test_a_chunked_body_is_refused_once_it_passes_the_limit(edge_server: Server) -> None:
    head = (
        "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (4096, b" " * 4096)
    with socket.create_connection(address(edge_server)) as sock:
        sock.sendall(head.encode() + chunk * (LIMIT // 4096 + 1))  # never the last chunk
        assert read_status(sock) == 413


def wait_for_lines(server: Server, text: str, count: int, timeout: float = 10) -> list[str]:
    """The server's log lines holding ``text``, once there are ``count`` (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in server.log().splitlines() if text in line]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_clients_that_leave_mid_body_leave_one_info_line_each(edge_server: Server) -> None:
    gone = "before its request body was complete"
    before = edge_server.log().count(gone)
    clients = 20
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 200\r\n\r\n"
    )
    half = b'{"messages": [{"role": "user", "content": "hal'
    for _ in range(clients):
        with socket.create_connection(address(edge_server)) as sock:
            sock.sendall(head.encode() + half)
    lines = wait_for_lines(edge_server, gone, before + clients)
    assert len(lines) == before + clients
    received = f"({len(half)} of 200 bytes)"
    assert all(" INFO " in line and received in line for line in lines[before:])
    time.sleep(0.5)  # anything uvicorn would add after the app returned
    log = edge_server.log()
    assert log.count(gone) == before + clients
    assert "Traceback" not in log and "ClientDisconnect" not in log
    assert httpx.get(f"{edge_server.url}/health", timeout=10).status_code == 200


def test_every_log_line_has_the_engine_format(edge_server: Server) -> None:
    assert httpx.get(f"{edge_server.url}/health", timeout=10).status_code == 200
    log = edge_server.log()
    odd = [line for line in log.splitlines() if not LOG_LINE.match(line)]
    assert not odd, odd[:10]
    assert re.search(r" frontend INFO uvicorn.error: Application startup complete", log)
    assert re.search(r' frontend INFO uvicorn.access: .*"GET /health HTTP/1.1" 200', log)
