"""The detokenizer as an exact FIFO single-server queue, one arrival per scheduler step.

A step's tokens reach the detokenizer together (one message), wait for it,
take ``tokens * cost per token`` of service, then stream back. Because steps
arrive in time order and the server is first-in first-out, each departure
follows from the previous one (Lindley's recursion)::

    depart[i] = max(arrive[i], depart[i-1]) + service[i]

With ``S`` the cumulative service this is ``depart[i] = S[i] + max_{j<=i}(arrive[j]
- S[j-1])``, so the steps of a replay are served in vectorized calls, with no
simulation event per step or per token. A ``Fifo`` carries ``S`` and the running
maximum from one call to the next, so serving the messages in chunks gives the
very floats of serving them at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class Fifo:
    """A FIFO server between chunks of messages: the service so far, the running maximum of
    ``arrive - service before it``, the last departure, and the queue's changes so far
    (time, +1 a message starts waiting / -1 it stops), in chunk order, when ``keep_queue``."""

    keep_queue: bool = True
    served: float = 0.0
    slack: float = -np.inf
    last_depart: float = -np.inf
    changes: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def queue(self) -> tuple[np.ndarray, np.ndarray]:
        """Messages waiting (not in service) at each change, in time order; at equal times
        departures from the queue come first."""
        times = np.concatenate([np.zeros(0), *(t for t, _ in self.changes)])
        delta = np.concatenate([np.zeros(0, np.int64), *(d for _, d in self.changes)])
        order = np.lexsort((delta, times))
        return times[order], np.cumsum(delta[order])


def serve_fifo(arrive: np.ndarray, service: np.ndarray, fifo: Fifo) -> np.ndarray:
    """Departures of messages arriving at ``arrive`` (sorted, after ``fifo``'s) that each take
    ``service`` seconds; ``fifo`` moves on past them."""
    if len(arrive) == 0:
        return np.zeros(0)
    cum = np.cumsum(np.concatenate(([fifo.served], service)))[1:]
    slack = np.empty_like(cum)  # first the service before each message
    slack[0] = fifo.served
    slack[1:] = cum[:-1]
    np.subtract(arrive, slack, out=slack)
    slack[0] = max(slack[0], fifo.slack)
    np.maximum.accumulate(slack, out=slack)
    fifo.served, fifo.slack = float(cum[-1]), float(slack[-1])
    depart = np.add(cum, slack, out=cum)
    del slack
    if fifo.keep_queue:
        before = np.concatenate(([fifo.last_depart], depart[:-1]))
        waited = np.flatnonzero(before > arrive)  # message i waits for message i - 1
        ones = np.ones(len(waited), np.int64)
        fifo.changes.append(
            (np.concatenate([arrive[waited], before[waited]]), np.concatenate([ones, -ones]))
        )
    fifo.last_depart = float(depart[-1])
    out: np.ndarray = depart
    return out
