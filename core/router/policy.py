"""Routing policies and their registry.

A policy picks one of the routable workers for a request. It sees the
request, the healthy workers with their outstanding load (never empty), and
``now``; it may keep state of its own (a cursor, a prefix tree, a session
table), told of every placement through ``routed`` and of a worker's removal
through ``forget``. It returns a ``Decision``: the worker and the reason,
counted by the router for reports and ``/metrics``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from core.router.config import RouterConfig
from core.router.request import RouteRequest, WorkerLoad


@dataclass(frozen=True, slots=True)
class Decision:
    worker: str
    reason: str


class Policy:
    name: ClassVar[str] = ""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config

    def choose(self, req: RouteRequest, workers: Sequence[WorkerLoad], now: float) -> Decision:
        raise NotImplementedError

    def routed(self, req: RouteRequest, worker: str, now: float) -> None:
        """``req`` was placed on ``worker`` (whoever chose it)."""

    def forget(self, worker: str) -> None:
        """``worker`` left the cluster."""

    def least_loaded(self, workers: Sequence[WorkerLoad]) -> WorkerLoad:
        """The least loaded worker in ``config.load``; ties go to the first added."""
        return min(workers, key=lambda w: w.load(self.config.load))


class RoundRobin(Policy):
    """Each healthy worker in turn, in the order the workers were added."""

    name = "round_robin"

    def __init__(self, config: RouterConfig) -> None:
        super().__init__(config)
        self._turn = 0

    def choose(self, req: RouteRequest, workers: Sequence[WorkerLoad], now: float) -> Decision:
        worker = workers[self._turn % len(workers)]
        self._turn += 1
        return Decision(worker.worker, "turn")


class LeastOutstanding(Policy):
    """The worker with the fewest outstanding requests (or tokens, with ``load = "tokens"``)."""

    name = "least_outstanding"

    def choose(self, req: RouteRequest, workers: Sequence[WorkerLoad], now: float) -> Decision:
        return Decision(self.least_loaded(workers).worker, "least_loaded")


class PowerOfTwo(Policy):
    """The less loaded of two workers drawn at random (from the router's seeded generator)."""

    name = "power_of_two"

    def __init__(self, config: RouterConfig) -> None:
        super().__init__(config)
        self._rng = random.Random(config.seed)

    def choose(self, req: RouteRequest, workers: Sequence[WorkerLoad], now: float) -> Decision:
        if len(workers) == 1:
            return Decision(workers[0].worker, "only")
        pair = self._rng.sample(range(len(workers)), 2)
        return Decision(self.least_loaded([workers[i] for i in sorted(pair)]).worker, "pair")


PolicyFactory = Callable[[RouterConfig], Policy]
POLICIES: dict[str, PolicyFactory] = {}


def register(cls: type[Policy]) -> type[Policy]:
    POLICIES[cls.name] = cls
    return cls


for _cls in (RoundRobin, LeastOutstanding, PowerOfTwo):
    register(_cls)


def make_policy(config: RouterConfig) -> Policy:
    """The policy ``config.policy`` names; ``ValueError`` for a name not in the registry."""
    try:
        factory = POLICIES[config.policy]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown router policy {config.policy!r}; known: {known}") from None
    return factory(config)
