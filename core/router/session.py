"""``session_sticky``: a conversation stays on one worker (its ``user`` or ``prompt_cache_key``).

A session's first request, and every request without a session, goes to the
least loaded worker. A session is pinned to the worker that served its last
request until ``session_ttl_s`` passes without a request, or its worker
stops being healthy; then it is pinned anew.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.router.config import RouterConfig
from core.router.policy import Decision, Policy, register
from core.router.request import RouteRequest, WorkerLoad


@register
class SessionSticky(Policy):
    name = "session_sticky"

    def __init__(self, config: RouterConfig) -> None:
        super().__init__(config)
        self.pins: dict[str, tuple[str, float]] = {}  # session -> (worker, last use)
        self._next_sweep = float("-inf")

    def choose(self, req: RouteRequest, workers: Sequence[WorkerLoad], now: float) -> Decision:
        if req.session is None:
            return Decision(self.least_loaded(workers).worker, "no_session")
        pin = self.pins.get(req.session)
        fresh = pin is not None and now - pin[1] < self.config.session_ttl_s
        if pin is not None and fresh and any(w.worker == pin[0] for w in workers):
            return Decision(pin[0], "pinned")
        return Decision(self.least_loaded(workers).worker, "new_session")

    def routed(self, req: RouteRequest, worker: str, now: float) -> None:
        if req.session is not None:
            last = self.pins.get(req.session, (worker, now))[1]
            self.pins[req.session] = (worker, max(now, last))
        if now >= self._next_sweep:
            ttl = self.config.session_ttl_s
            self.pins = {s: p for s, p in self.pins.items() if now - p[1] < ttl}
            self._next_sweep = now + ttl / 2

    def forget(self, worker: str) -> None:
        self.pins = {s: p for s, p in self.pins.items() if p[0] != worker}
