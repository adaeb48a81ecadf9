"""Fuzz every route of the server's own OpenAPI schema with schemathesis (bounded examples).

Valid and invalid requests alike must get an answer below 500; afterwards the
server is still up, logged no traceback, and answers a normal request. The
server runs with a short context (``--max-model-len``) and token limits in
generated bodies are capped, so that any request the schema allows is cheap on
CPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from conftest import Server, running_server
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

pytestmark = pytest.mark.slow

EXAMPLES = {GenerationMode.POSITIVE: 15, GenerationMode.NEGATIVE: 20}
MAX_TOKENS = 4


def cap_tokens(case: schemathesis.Case) -> schemathesis.Case:
    """Keep generation short: token limits above ``MAX_TOKENS`` are lowered to it."""
    body = case.body
    if isinstance(body, dict):
        for holder, key in ((body, "max_tokens"), (body, "max_completion_tokens")):
            if isinstance(holder.get(key), int) and holder[key] > MAX_TOKENS:
                holder[key] = MAX_TOKENS
        params = body.get("sampling_params")
        if isinstance(params, dict) and isinstance(params.get("max_new_tokens"), int):
            params["max_new_tokens"] = min(params["max_new_tokens"], MAX_TOKENS)
    return case


@pytest.fixture(scope="module")
def fuzz_server(model_ready: str) -> Iterator[Server]:
    with running_server("--max-model-len", "48", "--num-pages", "64", cpu_threads=2) as s:
        yield s


def test_openapi_schema_describes_every_route(fuzz_server: Server) -> None:
    spec = httpx.get(f"{fuzz_server.url}/openapi.json", timeout=10).json()
    paths = set(spec["paths"])
    assert {"/v1/chat/completions", "/v1/completions", "/generate", "/v1/models"} <= paths
    assert {"/health", "/metrics"} <= paths
    chat = spec["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["additionalProperties"] is False
    assert "messages" in chat["required"]
    assert chat["properties"]["top_logprobs"]["anyOf"][0]["maximum"] == 20


@pytest.mark.parametrize("mode", list(EXAMPLES), ids=lambda m: m.value)
def test_fuzzed_requests_never_get_a_server_error(
    fuzz_server: Server, mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    schema.config.generation.update(modes=[mode])
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and not len(operation.body):
            continue  # no body (the GETs, POST /flush_router), nothing to make invalid

        @settings(
            max_examples=EXAMPLES[mode],
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode).map(cap_tokens))
        def call(case: schemathesis.Case) -> None:
            nonlocal calls
            calls += 1
            response = case.call(timeout=120)
            assert response.status_code < 500, (case.as_curl_command(), response.text[:500])

        call()
    assert calls >= EXAMPLES[mode]
    assert fuzz_server.proc.poll() is None, "the server died under fuzzing"
    assert "Traceback" not in fuzz_server.log()
    ok = httpx.post(
        f"{fuzz_server.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=60
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
