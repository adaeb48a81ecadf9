"""What the router sees of a request, and of a worker."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import StrEnum


class Health(StrEnum):
    """A worker's state: only ``healthy`` workers get new requests.

    ``draining`` finishes what it has; ``dead`` finishes nothing (its open
    requests are the caller's to fail and report as aborted).
    """

    HEALTHY = "healthy"
    DRAINING = "draining"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """One request to place.

    ``key`` is the prompt as a sequence of hashable items, compared by prefix:
    token ids, chunks of text, or a trace's 512-token block hash ids.
    ``input_tokens`` and ``output_tokens`` (expected or maximum) weigh the
    request when ``load`` is ``tokens``. ``session`` (a client's ``user`` or
    ``prompt_cache_key``) pins a conversation to one worker. ``block_tokens``:
    the tokens each key item but the last stands for, when items are that
    coarse (a trace's blocks; 0: items are equal shares of the prompt).
    """

    rid: str
    key: tuple[Hashable, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    session: str | None = None
    block_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def share(self, items: int) -> float:
        """The share of the prompt that its first ``items`` key items cover: in tokens when
        ``block_tokens`` is set (a prompt of 1,619 tokens whose first two 512-token blocks
        match is 63 % matched, not 2 of 4 blocks), else in items."""
        if self.block_tokens > 0 and self.input_tokens > 0:
            return min(items * self.block_tokens, self.input_tokens) / self.input_tokens
        return items / len(self.key) if self.key else 0.0


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A routable worker as a policy sees it: its id and what it has outstanding."""

    worker: str
    requests: int
    tokens: int

    def load(self, unit: str) -> int:
        return self.tokens if unit == "tokens" else self.requests


class NoWorkerAvailable(RuntimeError):
    """No worker is healthy (or every healthy one was excluded): the request cannot be placed."""
