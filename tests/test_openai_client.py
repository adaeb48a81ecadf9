"""The real ``openai`` client against a real server: chat and completions, streamed or not."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import MODEL, Server
from openai import OpenAI

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(server: Server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=60, max_retries=0)


def chat(client: OpenAI, **kwargs: Any) -> Any:
    """A greedy answer of at most 12 tokens to ``CHAT``."""
    return client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=12, temperature=0, **kwargs
    )


def complete(
    client: OpenAI, prompt: Any, max_tokens: int, temperature: float = 0, **kwargs: Any
) -> Any:
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=temperature, **kwargs
    )


def test_models_lists_the_served_model(client: OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_non_streaming(client: OpenAI) -> None:
    out = chat(client)
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert out.usage is not None
    assert out.usage.prompt_tokens > 10  # the chat template adds a system turn
    assert 1 <= out.usage.completion_tokens <= 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_chat_streaming_matches_non_streaming(client: OpenAI) -> None:
    full = chat(client)
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == full.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_completion_non_streaming_hits_length(client: OpenAI) -> None:
    out = complete(client, "Once upon a time", 8, extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 8
    assert out.choices[0].text


def test_completion_streaming_and_token_id_prompt(client: OpenAI, model_ready: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_ready)
    ids = tok.encode("The capital of France is", add_special_tokens=False)
    full = complete(client, ids, 8)
    chunks = list(complete(client, "The capital of France is", 8, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert full.usage is not None and full.usage.prompt_tokens == len(ids)


def test_stop_string_truncates_and_finishes_with_stop(client: OpenAI) -> None:
    base = complete(client, "1, 2, 3, 4,", 12, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    assert len(text) > 4
    stop = text[2:4]
    cut = text[: text.index(stop)]
    for stream in (False, True):
        out = complete(client, "1, 2, 3, 4,", 12, stop=[stop], stream=stream)
        if stream:
            chunks = list(out)
            got = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            got, reason = out.choices[0].text, out.choices[0].finish_reason
        assert got == cut
        assert reason == "stop"


def test_seeded_sampling_repeats(client: OpenAI) -> None:
    def sample() -> str:
        out = complete(client, "My favourite food is", 10, temperature=1.0, seed=1234)
        return out.choices[0].text

    assert sample() == sample()


def test_repeated_prompt_hits_the_prefix_cache(client: OpenAI, server: Server) -> None:
    chat = [{"role": "user", "content": "Tell me about the prefix cache of this server."}]
    outs = [
        client.chat.completions.create(model=MODEL, messages=chat, max_tokens=4, temperature=0)
        for _ in range(2)
    ]
    first, second = (o.usage for o in outs)
    assert first is not None and second is not None
    assert second.prompt_tokens == first.prompt_tokens
    assert second.prompt_tokens_details is not None
    assert second.prompt_tokens_details.cached_tokens >= 16  # at least one full page
    assert outs[0].choices[0].message.content == outs[1].choices[0].message.content
    assert server.metrics()["engine_prefix_cache_hit_rate"] > 0
