"""A prompt as the router keys it, when it sees text or token ids rather than a trace's blocks.

Text is cut into chunks of ``TEXT_CHUNK`` characters, so the prefix tree
holds one item per chunk (an approximation, as in SGLang's router, which
matches characters); token ids are used as they are. The router never
tokenizes: a text prompt's token count is estimated at ``CHARS_PER_TOKEN``.
A chat is keyed by ``chat_text``. ``route_request`` builds the request both
routers of the engine place (``engine router`` from a request body, the
frontend of ``engine serve --dp`` from its ``GenerateRequest``), so a prompt
gets the same key in either.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from core.router.request import RouteRequest

TEXT_CHUNK = 16
CHARS_PER_TOKEN = 4


def prompt_key(text: str, ids: list[int] | None) -> tuple[tuple[Hashable, ...], int]:
    """A prompt's prefix key and its token count (estimated for text): its ids when it has
    them, else its text in ``TEXT_CHUNK``-character chunks."""
    if ids is not None:
        return tuple(ids), len(ids)
    key = tuple(text[i : i + TEXT_CHUNK] for i in range(0, len(text), TEXT_CHUNK))
    return key, len(text) // CHARS_PER_TOKEN


def chat_text(messages: Iterable[tuple[str, str]]) -> str:
    """The text a chat is keyed by: each message's role and content, a line each."""
    return "".join(f"{role}\n{content}\n" for role, content in messages)


def route_request(
    rid: str,
    text: str,
    ids: list[int] | None,
    output_limit: int = 0,
    session: str | None = None,
) -> RouteRequest:
    """What the router reads of a prompt (``text``, or its token ``ids``): its prefix key, its
    size, the output it may ask for (0: unknown) and its client's session."""
    key, input_tokens = prompt_key(text, ids)
    return RouteRequest(rid, key, input_tokens, output_limit, session)
