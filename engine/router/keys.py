"""What ``engine router`` reads of a request body: its prompt, output limit and session.

The request it places is ``core.router.prompt_key.route_request``'s, the same as
the frontend of ``engine serve --dp`` builds (a chat's text by ``chat_text``).
"""

from __future__ import annotations

from typing import Any

from core.router import RouteRequest
from core.router.prompt_key import chat_text, route_request

OUTPUT_LIMIT_FIELDS = ("max_completion_tokens", "max_tokens", "max_new_tokens")


def body_route(rid: str, body: dict[str, Any]) -> RouteRequest:
    """The ``RouteRequest`` of a chat, completion or native ``/generate`` body.

    A field of the wrong type is skipped here (the worker answers it with a 400).
    """
    session = next(
        (body[k] for k in ("prompt_cache_key", "user") if isinstance(body.get(k), str)), None
    )
    return route_request(rid, *prompt_of(body), output_limit(body), session)


def prompt_of(body: dict[str, Any]) -> tuple[str, list[int] | None]:
    """The prompt as text, or as token ids when the body gives ids."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return chat_text(message_text(m) for m in messages), None
    for name in ("prompt", "text", "input_ids"):
        value = body.get(name)
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            value = value[0]  # a batch: route by its first prompt
        if isinstance(value, str):
            return value, None
        if isinstance(value, list) and all(isinstance(t, int) for t in value):
            return "", value
    return "", None


def message_text(message: object) -> tuple[str, str]:
    """A body's chat message as (role, content text); what is not text counts as empty."""
    if not isinstance(message, dict):
        return "", ""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    role = message.get("role")
    return (role if isinstance(role, str) else ""), (content if isinstance(content, str) else "")


def output_limit(body: dict[str, Any]) -> int:
    params = body.get("sampling_params")
    for source in (body, params if isinstance(params, dict) else {}):
        for name in OUTPUT_LIMIT_FIELDS:
            value = source.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0
