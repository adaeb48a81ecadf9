"""Log-probabilities: the pure functions, then the server against HF transformers on SmolLM2.

The reference is ``log_softmax`` of HF's float32 CPU logits for the same token
sequence; the server's values come through the ``openai`` client, streamed and
not, for chat (``logprobs``/``top_logprobs``) and completions (``logprobs``,
``echo`` with prompt log-probs).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import MODEL, Server
from openai import OpenAI

from engine.sampling.logprobs import prompt_logprobs, sampled_logprobs

ATOL = 2e-3  # paged attention vs HF's dense attention, both float32


def test_sampled_and_prompt_logprobs_are_log_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 50, generator=gen) * 4
    reference = torch.log_softmax(logits, dim=-1)
    tokens = [3, 7, 11, 0, 49]
    out = sampled_logprobs(logits, tokens, [None, 0, 3, None, 20])
    assert out[0] is None and out[3] is None
    for row, k in ((1, 0), (2, 3), (4, 20)):
        entry = out[row]
        assert entry is not None and entry.token_id == tokens[row]
        assert entry.logprob == pytest.approx(float(reference[row, tokens[row]]), abs=1e-5)
        values, ids = reference[row].topk(k) if k else (torch.empty(0), torch.empty(0))
        assert entry.top_ids == ids.tolist()
        assert entry.top_logprobs == pytest.approx(values.tolist(), abs=1e-5)
    prompt = prompt_logprobs(logits, [4, 5, 6], 2)  # rows past the targets are unused
    assert [e.token_id for e in prompt] == [4, 5, 6]
    for row, e in enumerate(prompt):
        assert e.logprob == pytest.approx(float(reference[row, 4 + row]), abs=1e-5)
        assert e.top_ids == reference[row].topk(2).indices.tolist()


@pytest.fixture(scope="module")
def hf(model_ready: str) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_ready, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(model_ready)


def hf_logprobs(hf: Any, ids: list[int]) -> torch.Tensor:
    """``[len(ids), vocab]``: row i is the log-distribution of the token after ``ids[i]``."""
    model, _ = hf
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    out = list(ids)
    for _ in range(n):
        out.append(int(hf_logprobs(hf, out)[-1].argmax()))
    return out[len(ids) :]


@pytest.fixture(scope="module")
def client(server: Server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120, max_retries=0)


def check_top(got: list[tuple[str, float]], row: torch.Tensor, tok: Any) -> None:
    values, ids = row.topk(len(got))
    assert [v for _, v in got] == pytest.approx(values.tolist(), abs=ATOL)
    for (text, value), i, v in zip(got, ids.tolist(), values.tolist(), strict=True):
        if abs(value - v) < ATOL and (row - v).abs().lt(ATOL).sum() == 1:  # no near tie
            assert text == tok.decode([i])


@pytest.mark.slow
def test_chat_logprobs_match_hf(client: OpenAI, hf: Any) -> None:
    _, tok = hf
    chat = [{"role": "user", "content": "Name a fruit."}]
    text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    prompt = tok.encode(text, add_special_tokens=False)
    kwargs: Any = {"model": MODEL, "messages": chat, "max_tokens": 6, "temperature": 0}
    kwargs |= {"logprobs": True, "top_logprobs": 4, "extra_body": {"ignore_eos": True}}
    out = client.chat.completions.create(**kwargs)
    content = out.choices[0].logprobs.content
    expected = greedy(hf, prompt, 6)
    reference = hf_logprobs(hf, prompt + expected)
    assert len(content) == 6
    for i, (entry, token) in enumerate(zip(content, expected, strict=True)):
        row = reference[len(prompt) - 1 + i]
        assert entry.token == tok.decode([token])
        assert bytes(entry.bytes) == tok.decode([token]).encode() or "\ufffd" in entry.token
        assert entry.logprob == pytest.approx(float(row[token]), abs=ATOL)
        check_top([(t.token, t.logprob) for t in entry.top_logprobs], row, tok)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)


@pytest.mark.slow
def test_completion_echo_logprobs_match_hf(client: OpenAI, hf: Any) -> None:
    _, tok = hf
    text = "The capital of France is"
    prompt = tok.encode(text)
    kwargs: Any = {"model": MODEL, "max_tokens": 4, "temperature": 0, "logprobs": 3}
    kwargs |= {"echo": True, "extra_body": {"ignore_eos": True}}
    out = client.completions.create(prompt=text, **kwargs)
    lp = out.choices[0].logprobs
    expected = greedy(hf, prompt, 4)
    ids = prompt + expected
    reference = hf_logprobs(hf, ids)
    assert out.choices[0].text == text + tok.decode(expected)
    assert lp.tokens == [tok.decode([i]) for i in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == [len(tok.decode(ids[:i])) for i in range(len(ids))]
    for pos in range(1, len(ids)):
        row = reference[pos - 1]
        assert lp.token_logprobs[pos] == pytest.approx(float(row[ids[pos]]), abs=ATOL)
        top = sorted(lp.top_logprobs[pos].items(), key=lambda kv: -kv[1])[:3]
        check_top(top, row, tok)
    by_ids = client.completions.create(prompt=prompt, **kwargs)  # echo decodes a token prompt
    assert by_ids.choices[0].text == out.choices[0].text
    chunks = list(client.completions.create(prompt=text, stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == out.choices[0].text
    streamed = [
        v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed[0] is None
    assert streamed[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)
    offsets = [
        v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.text_offset
    ]
    assert offsets == lp.text_offset
