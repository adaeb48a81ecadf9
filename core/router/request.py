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
    ``prompt_cache_key``) pins a conversation to one worker.
    """

    rid: str
    key: tuple[Hashable, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    session: str | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


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
