"""Scheduling policies: the order in which waiting requests are admitted and
which running request is preempted when KV pages run out.

A policy gives every request a *static key* (smaller is served first) used to
keep the waiting queue sorted; ``order`` may refine the head of the queue with
information that changes over time (the prefix-cache match for ``lpm``). The
preemption victim is the running request with the largest key: the one the
policy would have served last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from core.scheduler.request import Request

Key = tuple[float, ...]


class Policy:
    name: ClassVar[str] = ""
    reorders: ClassVar[bool] = False  # whether ``order`` changes the static order

    def key(self, req: Request) -> Key:
        """Static admission key; ties broken by admission sequence by the caller."""
        raise NotImplementedError

    def order(
        self, waiting: Sequence[Request], match_pages: Callable[[Request], int]
    ) -> Sequence[Request]:
        """Waiting requests (already sorted by ``key``) in the order to try admitting them."""
        return waiting

    def victim(self, running: Sequence[Request]) -> Request:
        return max(running, key=lambda r: (*self.key(r), r.seq))


class FCFS(Policy):
    """First come, first served: earliest arrival first."""

    name = "fcfs"

    def key(self, req: Request) -> Key:
        return (req.arrival,)


class Priority(Policy):
    """Smallest ``priority`` value first, then earliest arrival."""

    name = "priority"

    def key(self, req: Request) -> Key:
        return (float(req.priority), req.arrival)


class ShortestJobFirst(Policy):
    """Shortest expected remaining output first (``expected_output_len``, else the limit)."""

    name = "sjf"

    def key(self, req: Request) -> Key:
        return (float(req.expected_remaining), req.arrival)


class LongestPrefixMatch(Policy):
    """Longest cached prefix first, among the first ``window`` waiting requests by arrival.

    Beyond the window the queue is served first come, first served, which
    bounds the cost of matching every waiting request at every step.
    """

    name = "lpm"
    reorders = True
    window: ClassVar[int] = 128

    def key(self, req: Request) -> Key:
        return (req.arrival,)

    def order(
        self, waiting: Sequence[Request], match_pages: Callable[[Request], int]
    ) -> Sequence[Request]:
        if len(waiting) > self.window:
            return waiting
        scored = [(-match_pages(r), i, r) for i, r in enumerate(waiting)]
        scored.sort(key=lambda t: (t[0], t[1]))
        return [r for _, _, r in scored]


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (FCFS, LongestPrefixMatch, Priority, ShortestJobFirst)
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown scheduling policy {name!r}; known: {known}") from None
