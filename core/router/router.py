"""The router: one object places requests on workers, in the real cluster and the simulated one.

Contract (pure: no clock, no I/O; time and worker state come in as arguments):

- ``route(request, now)`` returns the id of a healthy worker, or raises
  ``NoWorkerAvailable``; the request is then open on that worker;
- ``finished(rid, now)`` / ``aborted(rid, now)`` close it (a second end, or
  the end of an unknown rid, is ignored and returns None);
- ``set_health(worker, health)``: only ``healthy`` workers get requests;
  ``add_worker`` / ``remove_worker`` change the cluster (removing a worker
  drops its open requests from the books and returns their rids);
- the same calls in the same order give the same decisions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from core.router.config import RouterConfig
from core.router.policy import Policy, make_policy
from core.router.request import Health, NoWorkerAvailable, RouteRequest
from core.router.workers import WorkerTable


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """A worker as reports and ``/metrics`` show it."""

    worker: str
    health: Health
    outstanding_requests: int
    outstanding_tokens: int
    routed: int
    finished: int
    aborted: int


class Router:
    def __init__(self, config: RouterConfig, workers: Iterable[str] = ()) -> None:
        self.config = config
        self.policy: Policy = make_policy(config)
        self.table = WorkerTable()
        self.decisions: Counter[str] = Counter()
        for worker in workers:
            self.add_worker(worker)

    def route(self, request: RouteRequest, now: float, exclude: Collection[str] = ()) -> str:
        """The worker for ``request`` (never one in ``exclude``: e.g. one that just refused it)."""
        if request.rid in self.table.open:
            raise ValueError(f"request {request.rid!r} is already open")
        workers = [w for w in self.table.routable() if w.worker not in exclude]
        if not workers:
            raise NoWorkerAvailable(
                f"no healthy worker for request {request.rid!r} "
                f"({len(self.table.workers)} known, {len(exclude)} excluded)"
            )
        decision = self.policy.choose(request, workers, now)
        self.table.assign(request.rid, decision.worker, request.tokens)
        self.policy.routed(request, decision.worker, now)
        self.decisions[decision.reason] += 1
        return decision.worker

    def flush(self) -> None:
        """Forget the prompts and sessions placed so far: a fresh policy (empty prefix trees,
        no session pins, round robin from the first worker), as a new router starts. Open
        requests keep their workers and their load."""
        self.policy = make_policy(self.config)

    def finished(self, rid: str, now: float) -> str | None:
        """``rid`` completed; returns its worker (None if it was not open)."""
        return self.table.end(rid, aborted=False)

    def aborted(self, rid: str, now: float) -> str | None:
        """``rid`` ended without completing (client gone, worker failed); returns its worker."""
        return self.table.end(rid, aborted=True)

    def set_health(self, worker: str, health: Health) -> None:
        self.table.entry(worker).health = Health(health)

    def add_worker(self, worker: str, health: Health = Health.HEALTHY) -> None:
        self.table.add(worker)
        self.table.entry(worker).health = Health(health)

    def remove_worker(self, worker: str) -> list[str]:
        """Forget ``worker`` and its prefix entries; returns the rids that were open on it."""
        rids = self.table.remove(worker)
        self.policy.forget(worker)
        return rids

    def worker_of(self, rid: str) -> str | None:
        placed = self.table.open.get(rid)
        return None if placed is None else placed[0]

    def open_requests(self, worker: str) -> list[str]:
        return self.table.open_on(worker)

    def health(self, worker: str) -> Health:
        return self.table.entry(worker).health

    @property
    def workers(self) -> list[str]:
        return list(self.table.workers)

    @property
    def outstanding(self) -> int:
        return len(self.table.open)

    def stats(self) -> list[WorkerStats]:
        return [
            WorkerStats(w, e.health, e.requests, e.tokens, e.routed, e.finished, e.aborted)
            for w, e in self.table.workers.items()
        ]
