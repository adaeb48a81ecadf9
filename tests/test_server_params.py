"""Every OpenAI request field is honoured or refused with a 400 that names it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import MODEL, Server

from engine.server.protocol import ChatCompletionRequest, CompletionRequest
from engine.server.translate import UNSUPPORTED

# fields the server implements (sampling, prompt, streaming, log-probs, identifiers it logs,
# a prefill/decode pair's route: tests/test_pd_engine.py)
IMPLEMENTED = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
    "ignore_eos", "n", "stream", "stream_options", "priority", "user", "return_meta_info", "pd",
}  # fmt: skip
CHAT_IMPLEMENTED = {
    "messages", "max_completion_tokens", "logprobs", "top_logprobs", "parallel_tool_calls",
    "prompt_cache_key", "safety_identifier",
}  # fmt: skip
COMPLETION_IMPLEMENTED = {"prompt", "echo", "logprobs"}


@pytest.mark.parametrize(
    ("model", "own"),
    [(ChatCompletionRequest, CHAT_IMPLEMENTED), (CompletionRequest, COMPLETION_IMPLEMENTED)],
)
def test_every_field_is_implemented_or_refused(model: Any, own: set[str]) -> None:
    fields = set(model.model_fields)
    refused = fields & set(UNSUPPORTED)
    assert fields == IMPLEMENTED | own | refused, fields ^ (IMPLEMENTED | own | refused)
    assert not (IMPLEMENTED | own) & set(UNSUPPORTED)


MSGS = [{"role": "user", "content": "hi"}]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"

REFUSED: list[tuple[str, str, dict[str, Any], str]] = [
    ("unknown field", CHAT, {"messages": MSGS, "foo": 1}, "foo"),
    (
        "nested unknown field",
        CHAT,
        {"messages": [{"role": "user", "content": "x", "y": 1}]},
        "messages.0.y",
    ),
    (
        "frequency_penalty",
        COMPLETIONS,
        {"prompt": "a", "frequency_penalty": 0.5},
        "frequency_penalty",
    ),
    ("presence_penalty", CHAT, {"messages": MSGS, "presence_penalty": -1}, "presence_penalty"),
    ("penalty out of range", CHAT, {"messages": MSGS, "presence_penalty": 3}, "presence_penalty"),
    ("logit_bias", COMPLETIONS, {"prompt": "a", "logit_bias": {"5": 10}}, "logit_bias"),
    ("best_of", COMPLETIONS, {"prompt": "a", "best_of": 2}, "best_of"),
    ("suffix", COMPLETIONS, {"prompt": "a", "suffix": "z"}, "suffix"),
    ("tools", CHAT, {"messages": MSGS, "tools": [{"type": "function"}]}, "tools"),
    ("tool_choice", CHAT, {"messages": MSGS, "tool_choice": "auto"}, "tool_choice"),
    (
        "response_format",
        CHAT,
        {"messages": MSGS, "response_format": {"type": "json_object"}},
        "response_format",
    ),
    ("modalities", CHAT, {"messages": MSGS, "modalities": ["audio"]}, "modalities"),
    ("reasoning_effort", CHAT, {"messages": MSGS, "reasoning_effort": "low"}, "reasoning_effort"),
    ("service_tier", CHAT, {"messages": MSGS, "service_tier": "flex"}, "service_tier"),
    ("store", CHAT, {"messages": MSGS, "store": True}, "store"),
    (
        "stream_options",
        CHAT,
        {"messages": MSGS, "stream_options": {"include_usage": True}},
        "stream_options",
    ),
    ("top_logprobs", CHAT, {"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
    (
        "top_logprobs too many",
        CHAT,
        {"messages": MSGS, "logprobs": True, "top_logprobs": 21},
        "top_logprobs",
    ),
    ("logprobs too many", COMPLETIONS, {"prompt": "a", "logprobs": 21}, "logprobs"),
    ("seed too large", COMPLETIONS, {"prompt": "a", "seed": 2**64}, "seed"),
    ("token id too large", COMPLETIONS, {"prompt": [1, 2**40]}, "prompt"),
    ("temperature > 2", CHAT, {"messages": MSGS, "temperature": 2.5}, "temperature"),
    ("empty stop", COMPLETIONS, {"prompt": "a", "stop": [""]}, "stop"),
    ("several prompts", COMPLETIONS, {"prompt": ["a", "b"]}, "prompt"),
    (
        "image part",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages.0.content",
    ),
    ("tool message", CHAT, {"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    (
        "message name",
        CHAT,
        {"messages": [{"role": "user", "content": "x", "name": "a"}]},
        "messages.0.name",
    ),
    (
        "generate unknown",
        "/generate",
        {"text": "a", "sampling_params": {"min_p": 0.1}},
        "sampling_params.min_p",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "body", "param"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_unsupported_or_out_of_range_is_a_400_naming_the_field(
    server: Server, path: str, body: dict[str, Any], param: str
) -> None:
    resp = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] is not None and error["param"].startswith(param), error
    assert param.split(".")[-1] in error["message"], error


@pytest.mark.slow
def test_neutral_values_of_unsupported_fields_are_accepted(server: Server) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "developer", "content": "Be brief."}, *MSGS],
        "max_completion_tokens": 2,
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "logit_bias": {},
        "tools": [],
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "modalities": ["text"],
        "service_tier": "auto",
        "store": False,
        "n": 1,
        "user": "someone",
        "parallel_tool_calls": False,
        "stream": True,
        "stream_options": {"include_usage": True, "include_obfuscation": False},
    }
    resp = httpx.post(f"{server.url}{CHAT}", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.text.rstrip().endswith("data: [DONE]")
