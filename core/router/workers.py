"""The router's bookkeeping: each worker's health and what it has outstanding, by rid.

Invariants (checked by ``check``):

- every open rid is on a known worker, and a worker's counts are the sums
  over its open rids (requests, tokens);
- when every routed request has ended (finished or aborted, or its worker was
  removed), nothing is outstanding anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.router.request import Health, WorkerLoad


@dataclass(slots=True)
class WorkerEntry:
    health: Health = Health.HEALTHY
    requests: int = 0
    tokens: int = 0
    routed: int = 0
    finished: int = 0
    aborted: int = 0


@dataclass(slots=True)
class WorkerTable:
    workers: dict[str, WorkerEntry] = field(default_factory=dict)
    open: dict[str, tuple[str, int]] = field(default_factory=dict)  # rid -> (worker, tokens)

    def add(self, worker: str) -> None:
        if worker in self.workers:
            raise ValueError(f"worker {worker!r} is already known")
        self.workers[worker] = WorkerEntry()

    def remove(self, worker: str) -> list[str]:
        """Forget ``worker``; returns its open rids, which are dropped from the books."""
        self.entry(worker)
        rids = self.open_on(worker)
        for rid in rids:
            del self.open[rid]
        del self.workers[worker]
        return rids

    def entry(self, worker: str) -> WorkerEntry:
        try:
            return self.workers[worker]
        except KeyError:
            raise ValueError(f"unknown worker {worker!r}") from None

    def routable(self) -> list[WorkerLoad]:
        """The healthy workers, in the order they were added."""
        return [
            WorkerLoad(w, e.requests, e.tokens)
            for w, e in self.workers.items()
            if e.health is Health.HEALTHY
        ]

    def assign(self, rid: str, worker: str, tokens: int) -> None:
        if rid in self.open:
            raise ValueError(f"request {rid!r} is already open on {self.open[rid][0]!r}")
        e = self.entry(worker)
        self.open[rid] = (worker, tokens)
        e.requests += 1
        e.tokens += tokens
        e.routed += 1

    def end(self, rid: str, aborted: bool) -> str | None:
        """Close ``rid``; returns its worker, or None when it is not open (already ended)."""
        placed = self.open.pop(rid, None)
        if placed is None:
            return None
        worker, tokens = placed
        e = self.workers[worker]
        e.requests -= 1
        e.tokens -= tokens
        if aborted:
            e.aborted += 1
        else:
            e.finished += 1
        return worker

    def open_on(self, worker: str) -> list[str]:
        return [rid for rid, (w, _) in self.open.items() if w == worker]

    def check(self) -> None:
        """Raise AssertionError if the counts disagree with the open rids."""
        for worker, e in self.workers.items():
            mine = [t for w, t in self.open.values() if w == worker]
            assert e.requests == len(mine), (worker, e.requests, len(mine))
            assert e.tokens == sum(mine), (worker, e.tokens, sum(mine))
        assert all(w in self.workers for w, _ in self.open.values())
