"""Bad input gets a 4xx with an OpenAI-style error body, and the server keeps serving, in the
``split`` layout and in ``inline`` (where scheduler rank 0 rejects a prompt itself)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from conftest import MODEL, Server, running_server

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module", params=["split", "inline"])
def server(request: pytest.FixtureRequest, server: Server) -> Iterator[Server]:
    """The shared ``split`` server, then one of ``--layout inline``."""
    if request.param == "split":
        yield server
        return
    with running_server("--layout", "inline", "--num-pages", "1024", cpu_threads=2) as s:
        yield s


CASES = [
    ("malformed json", COMPLETIONS, b'{"prompt": "hi", "max_tokens": ', 400, None),
    ("body not an object", COMPLETIONS, [1, 2, 3], 400, None),
    ("max_tokens wrong type", COMPLETIONS, {"prompt": "a", "max_tokens": "x"}, 400, "max_tokens"),
    ("messages wrong type", CHAT, {"messages": "hello"}, 400, "messages"),
    ("missing messages", CHAT, {"model": MODEL}, 400, "messages"),
    ("negative max_tokens", COMPLETIONS, {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    ("zero max_tokens", CHAT, {"messages": MSGS, "max_tokens": 0}, 400, "max_tokens"),
    ("absurd max_tokens", CHAT, {"messages": MSGS, "max_tokens": 10**9}, 400, "max_tokens"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("unknown role", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    ("unknown model", CHAT, {"model": "gpt-9", "messages": MSGS}, 404, "model"),
    ("n > 1", COMPLETIONS, {"prompt": "hi", "n": 2}, 400, "n"),
    ("temperature < 0", COMPLETIONS, {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("top_p > 1", COMPLETIONS, {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("empty prompt", COMPLETIONS, {"prompt": ""}, 400, None),
    ("token id out of range", COMPLETIONS, {"prompt": [1, 10**7]}, 400, None),
    ("prompt too long", COMPLETIONS, {"prompt": "hello " * 9000, "max_tokens": 4}, 400, None),
    (
        "prompt + max_tokens too long",
        COMPLETIONS,
        {"prompt": "hi " * 8000, "max_tokens": 500},
        400,
        None,
    ),
    ("generate without prompt", "/generate", {"sampling_params": {}}, 400, None),
    (
        "generate bad sampling",
        "/generate",
        {"text": "a", "sampling_params": {"top_k": "x"}},
        400,
        None,
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_a_clear_4xx(
    server: Server, path: str, body: object, status: int, param: str | None
) -> None:
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    resp = httpx.post(
        f"{server.url}{path}", timeout=60, headers={"content-type": "application/json"}, **kwargs
    )
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param), error
    for stream in (False, True):  # the server still answers, streamed or not
        ok = httpx.post(
            f"{server.url}{COMPLETIONS}",
            json={"prompt": "Hello", "max_tokens": 2, "stream": stream},
            timeout=60,
        )
        assert ok.status_code == 200
    assert "Traceback" not in server.log()


def test_streaming_request_with_bad_prompt_fails_before_streaming(server: Server) -> None:
    body = {"prompt": "hello " * 9000, "max_tokens": 4, "stream": True}
    resp = httpx.post(f"{server.url}{COMPLETIONS}", json=body, timeout=60)
    assert resp.status_code == 400
    assert "context" in resp.json()["error"]["message"]
    assert "Traceback" not in server.log()


def test_unknown_route_is_404(server: Server) -> None:
    resp = httpx.get(f"{server.url}/v1/nothing", timeout=10)
    assert resp.status_code == 404
    assert "error" in resp.json()
    assert "Traceback" not in server.log()


def test_generate_returns_stage_timestamps(server: Server) -> None:
    resp = httpx.post(
        f"{server.url}/generate",
        json={
            "text": "Hello there",
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
        },
        timeout=60,
    )
    assert resp.status_code == 200
    out = resp.json()
    meta = out["meta_info"]
    assert len(out["output_ids"]) == meta["completion_tokens"] == 4
    stages = [
        meta[k] for k in ("received", "tokenized", "first_scheduled", "first_token", "finished")
    ]
    assert stages == sorted(stages)
    assert len(meta["token_times"]) == 4 and meta["token_times"] == sorted(meta["token_times"])
    assert meta["finish_reason"] == {"type": "length"}
    assert meta["ttft"] > 0 and meta["e2e_latency"] >= meta["ttft"]
