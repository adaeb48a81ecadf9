"""Log-prob entries in the OpenAI wire shapes that the ``openai`` client parses.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``.
Completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``,
where ``top_logprobs`` maps token text to log-prob (the top alternatives plus
the chosen token) and is null for a prompt's first token, like its log-prob.
A token's text is its bytes decoded as UTF-8 (U+FFFD where a token holds only
part of a character; ``bytes`` then has the exact bytes).
"""

from __future__ import annotations

from typing import Any

from engine.sampling.logprobs import TokenLogprob

LOGPROB_FLOOR = -9999.0  # JSON has no -Infinity


def _text(pieces: dict[int, bytes], token_id: int) -> str:
    return pieces.get(token_id, b"").decode("utf-8", errors="replace")


def _value(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def _chat_token(pieces: dict[int, bytes], token_id: int, logprob: float) -> dict[str, Any]:
    return {
        "token": _text(pieces, token_id),
        "logprob": _value(logprob),
        "bytes": list(pieces.get(token_id, b"")),
    }


def chat_logprobs(entries: list[TokenLogprob], pieces: dict[int, bytes]) -> dict[str, Any]:
    content = []
    for e in entries:
        item = _chat_token(pieces, e.token_id, e.logprob or 0.0)
        item["top_logprobs"] = [
            _chat_token(pieces, i, lp) for i, lp in zip(e.top_ids, e.top_logprobs, strict=True)
        ]
        content.append(item)
    return {"content": content}


def completion_logprobs(
    entries: list[TokenLogprob], pieces: dict[int, bytes], offset: int
) -> tuple[dict[str, Any], int]:
    """The ``logprobs`` object of ``entries`` whose text starts at character ``offset`` of the
    choice's text, and the offset after them (streams continue from there)."""
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for e in entries:
        text = _text(pieces, e.token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if e.logprob is None:
            values.append(None)
            tops.append(None)
            continue
        values.append(_value(e.logprob))
        top = {
            _text(pieces, i): _value(lp) for i, lp in zip(e.top_ids, e.top_logprobs, strict=True)
        }
        top.setdefault(text, _value(e.logprob))
        tops.append(top)
    body = {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }
    return body, offset
