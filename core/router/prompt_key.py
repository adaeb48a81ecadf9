"""A prompt as the router keys it, when it sees text or token ids rather than a trace's blocks.

Text is cut into chunks of ``TEXT_CHUNK`` characters, so the prefix tree
holds one item per chunk (an approximation, as in SGLang's router, which
matches characters); token ids are used as they are. The router never
tokenizes: a text prompt's token count is estimated at ``CHARS_PER_TOKEN``.
"""

from __future__ import annotations

from collections.abc import Hashable

TEXT_CHUNK = 16
CHARS_PER_TOKEN = 4


def prompt_key(text: str, ids: list[int] | None) -> tuple[tuple[Hashable, ...], int]:
    """A prompt's prefix key and its token count (estimated for text): its ids when it has
    them, else its text in ``TEXT_CHUNK``-character chunks."""
    if ids is not None:
        return tuple(ids), len(ids)
    key = tuple(text[i : i + TEXT_CHUNK] for i in range(0, len(text), TEXT_CHUNK))
    return key, len(text) // CHARS_PER_TOKEN
