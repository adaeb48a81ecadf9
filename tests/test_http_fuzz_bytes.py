"""Fuzz the HTTP layer with raw bytes (Hypothesis), beside the schemathesis run.

schemathesis sends what the OpenAPI schema describes, always as well-formed
JSON; this sends what a broken or hostile client sends: invalid UTF-8, lone
surrogate escapes, NaN and numbers of thousands of digits, duplicate keys,
nesting tens of thousands deep, bodies past ``--max-request-bytes``, and
content types that are not JSON. Every answer must be below 500, the log must
hold no traceback, and the server must serve normally afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from conftest import Server, running_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

LIMIT = 65536
EXAMPLES = 300
ROUTES = ("/v1/chat/completions", "/v1/completions", "/generate")
FIELDS = (
    "prompt", "messages", "role", "content", "type", "text", "stop", "max_tokens",
    "max_new_tokens", "sampling_params", "input_ids", "temperature", "top_p", "top_k", "seed",
    "stream", "stream_options", "include_usage", "logprobs", "top_logprobs", "echo", "n",
    "priority", "user", "tools", "metadata", "logit_bias", "model", "stop_token_ids",
    "ignore_eos", "response_format", "return_meta_info",
)  # fmt: skip
CONTENT_TYPES = (
    "application/json", "application/json; charset=latin-1", "text/plain",
    "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "",
)  # fmt: skip


@pytest.fixture(scope="module")
def bytes_server(model_ready: str) -> Iterator[Server]:
    args = ("--max-request-bytes", str(LIMIT), "--max-model-len", "48", "--num-pages", "64")
    with running_server(*args, cpu_threads=2) as s:
        yield s


def joined(open_: bytes, items: list[bytes], close: bytes) -> bytes:
    return open_ + b",".join(items) + close


# A string literal from pieces: ordinary text, lone surrogate escapes, raw (often invalid) bytes.
string_piece = st.one_of(
    st.text(max_size=8).map(lambda t: json.dumps(t)[1:-1].encode()),
    st.integers(0xD800, 0xDFFF).map(lambda c: b"\\u%04x" % c),
    st.binary(min_size=1, max_size=3),
)
strings = st.lists(string_piece, max_size=4).map(lambda parts: joined(b'"', parts, b'"'))
numbers = st.one_of(
    st.integers(-(2**70), 2**70).map(lambda n: str(n).encode()),
    st.integers(1, 6000).map(lambda n: b"9" * n),  # past Python's 4300-digit limit
    st.floats().map(lambda x: json.dumps(x).encode()),  # NaN, Infinity included
    st.sampled_from([b"1e999", b"-1e999", b"1.5e-400", b"-0", b"0.0", b"01", b"1."]),
)
scalars = st.one_of(strings, numbers, st.sampled_from([b"true", b"false", b"null"]))
keys = st.one_of(st.sampled_from(FIELDS).map(lambda f: json.dumps(f).encode()), strings)


def containers(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    pairs = st.tuples(keys, children).map(lambda kv: kv[0] + b":" + kv[1])
    return st.one_of(
        st.lists(children, max_size=4).map(lambda items: joined(b"[", items, b"]")),
        st.lists(pairs, max_size=5).map(lambda items: joined(b"{", items, b"}")),  # dup keys
    )


values = st.recursive(scalars, containers, max_leaves=12)
objects = st.lists(
    st.tuples(keys, values).map(lambda kv: kv[0] + b":" + kv[1]), min_size=1, max_size=6
).map(lambda items: joined(b"{", items, b"}"))
deep = st.tuples(st.integers(1, 40000), st.sampled_from([b"[", b'{"a":'])).map(
    lambda nd: nd[1] * nd[0] + (b"]" * nd[0] if nd[1] == b"[" else b"1" + b"}" * nd[0])
)
# a valid request of a route with one value fuzzed (%s), to get past the schema to the pipeline
TEMPLATES = (
    ("/v1/completions", b'{"prompt": %s, "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": "Hi", "max_tokens": 2, "stop": %s}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": %s}], "max_tokens": 2}'),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "user": %s}',
    ),
    ("/generate", b'{"text": %s, "sampling_params": {"max_new_tokens": 2}}'),
    ("/generate", b'{"text": "Hi", "sampling_params": {"max_new_tokens": 2, "stop": %s}}'),
)
fillers = st.one_of(strings, strings.map(lambda s: b"[" + s + b"]"), values)
shaped = st.tuples(st.sampled_from(TEMPLATES), fillers).map(lambda tf: (tf[0][0], tf[0][1] % tf[1]))
bodies = st.one_of(
    objects,
    deep,
    st.binary(max_size=256),
    objects.map(lambda b: b.decode("utf-8", "replace").encode("utf-16")),
    st.integers(LIMIT - 8, LIMIT + 8).map(lambda n: b'{"prompt": "%s"}' % (b"a" * n)),
)
requests = st.one_of(shaped, st.tuples(st.sampled_from(ROUTES), bodies))


def test_raw_bytes_never_get_a_server_error(bytes_server: Server) -> None:
    calls = 0

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=requests, content_type=st.sampled_from(CONTENT_TYPES))
    def call(request: tuple[str, bytes], content_type: str) -> None:
        nonlocal calls
        calls += 1
        path, body = request
        headers = {"content-type": content_type} if content_type else {}
        seen = len(bytes_server.log())
        resp = httpx.post(f"{bytes_server.url}{path}", content=body, headers=headers, timeout=60)
        assert resp.status_code < 500, (body[:300], resp.text[:300])
        logged = bytes_server.log()[seen:]
        assert "Traceback" not in logged, (body[:300], logged[-3000:])

    call()
    assert calls >= EXAMPLES
    assert bytes_server.proc.poll() is None, "the server died under fuzzing"
    assert httpx.get(f"{bytes_server.url}/health", timeout=10).status_code == 200
    ok = httpx.post(
        f"{bytes_server.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=60
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    assert "Traceback" not in bytes_server.log()
