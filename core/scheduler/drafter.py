"""Drafters for speculative decoding: who proposes the tokens a decode slot verifies.

A ``Drafter`` reads a request's sequence (``prompt`` followed by ``output``:
token ids in the engine) and proposes tokens to follow it; the target model
verifies them in the next step (``core.scheduler.plan``, "Draft tokens").
Proposals only cost time: a wrong draft token is rejected, never delivered,
so a drafter can make speculation slow but never wrong. Drafters are plain
Python and deterministic, like the rest of the core.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Protocol

from core.scheduler.plan import PLACEHOLDER_TOKEN
from core.scheduler.request import Request

__all__ = ["Drafter", "NgramDrafter", "PlaceholderDrafter", "RepeatDrafter"]


class Drafter(Protocol):
    """Proposes draft tokens for a decoding request."""

    def propose(self, req: Request, k: int) -> Sequence[int]:
        """At most ``k`` tokens to follow ``req``'s sequence (``prompt`` + ``output``); fewer,
        even none, when it has no good guess. Must not change ``req``."""
        ...


class PlaceholderDrafter:
    """Always ``k`` placeholder tokens: the simulator's, which has no tokens (how many are
    accepted is drawn when the step completes)."""

    def propose(self, req: Request, k: int) -> Sequence[int]:
        return (PLACEHOLDER_TOKEN,) * max(k, 0)


class RepeatDrafter:
    """Always ``k`` copies of the sequence's last token: real token ids without a drafting
    model, for an acceptance rule that ignores them (the engine's ``--speculative synthetic``).
    None for a request that holds no token (an engine request that scores its prompt keeps
    no prompt in the core, and has no output yet)."""

    def propose(self, req: Request, k: int) -> Sequence[int]:
        last = req.output or req.prompt
        return (last[-1],) * k if last and k > 0 else ()


class NgramDrafter:
    """Prompt lookup: the tokens that followed the most recent earlier occurrence of the
    sequence's last ``n`` tokens, trying ``n`` from ``max_ngram`` down to ``min_ngram``.

    Cost per call, for a sequence of ``L`` tokens: building an 8-byte-per-token
    byte string of it and at most ``max_ngram - min_ngram + 1`` reverse
    searches (``bytes.rfind``), each O(L) at C speed; no Python loop over the
    sequence. (A match at an offset that is not a token boundary is skipped.)
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"n-gram sizes must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}"
                f" and {max_ngram}"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, req: Request, k: int) -> Sequence[int]:
        if k <= 0:
            return ()
        tokens = array("q", req.prompt)
        tokens.extend(req.output)
        return lookup(tokens, k, self.max_ngram, self.min_ngram)


def lookup(tokens: array[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the last ``n``
    tokens, for the largest ``n`` in ``[min_ngram, max_ngram]`` that occurs earlier."""
    size = len(tokens)
    width = tokens.itemsize
    data = tokens.tobytes()
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        pattern = data[(size - n) * width :]
        end = (size - 1) * width  # an occurrence ends before the last token: it is earlier
        while True:
            at = data.rfind(pattern, 0, end)
            if at < 0:
                break
            if at % width == 0:
                start = at // width + n
                return tokens[start : start + k].tolist()
            end = at + len(pattern) - 1  # not on a token boundary: look further back
    return []
