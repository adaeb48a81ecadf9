"""The detokenizer as an exact FIFO single-server queue, one arrival per scheduler step.

A step's tokens reach the detokenizer together (one message), wait for it,
take ``tokens * cost per token`` of service, then stream back. Because steps
arrive in time order and the server is first-in first-out, each departure
follows from the previous one (Lindley's recursion)::

    depart[i] = max(arrive[i], depart[i-1]) + service[i]

so a whole fast-forwarded run of steps is served in one vectorized call, with
no simulation event per step or per token.
"""

from __future__ import annotations

import numpy as np


class DetokenizerQueue:
    def __init__(self, cost_per_token: float) -> None:
        self.cost_per_token = cost_per_token
        self.last_departure = -np.inf
        self._waits: list[tuple[float, float]] = []  # (arrive, start) of messages that waited
        self._run_waits: list[tuple[np.ndarray, np.ndarray]] = []

    def serve_one(self, arrive: float, tokens: int) -> float:
        """Departure time of one step's message of ``tokens`` tokens."""
        if self.last_departure > arrive:
            self._waits.append((arrive, self.last_departure))
        depart = max(arrive, self.last_departure) + tokens * self.cost_per_token
        self.last_departure = depart
        return depart

    def serve_run(self, arrive: np.ndarray, tokens: int) -> np.ndarray:
        """Departures of consecutive steps arriving at ``arrive`` (sorted), ``tokens`` each.

        With S the cumulative service, ``depart[i] = S[i] + max_{j<=i}(arrive[j] - S[j-1])``,
        the earlier backlog entering as ``last_departure``.
        """
        service = np.full(len(arrive), tokens * self.cost_per_token)
        cum = np.cumsum(service)
        before = np.concatenate(([0.0], cum[:-1]))
        slack = np.maximum.accumulate(arrive - before)
        depart = cum + np.maximum(slack, self.last_departure)
        previous = np.concatenate(([self.last_departure], depart[:-1]))
        self.last_departure = float(depart[-1])
        waited = previous > arrive
        if waited.any():
            self._run_waits.append((arrive[waited], previous[waited]))
        return depart

    def queue_samples(self) -> tuple[np.ndarray, np.ndarray]:
        """(time, messages waiting for the detokenizer, not in service) at each change."""
        pairs = [(np.array([a]), np.array([b])) for a, b in self._waits] + self._run_waits
        if not pairs:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        arrive = np.concatenate([a for a, _ in pairs])
        start = np.concatenate([b for _, b in pairs])
        times = np.concatenate([arrive, start])
        delta = np.concatenate([np.ones(len(arrive), np.int64), -np.ones(len(start), np.int64)])
        order = np.lexsort((delta, times))  # at equal times, departures first
        return times[order], np.cumsum(delta[order])
