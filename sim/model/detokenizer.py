"""The detokenizer as an exact FIFO single-server queue, one arrival per scheduler step.

A step's tokens reach the detokenizer together (one message), wait for it,
take ``tokens * cost per token`` of service, then stream back. Because steps
arrive in time order and the server is first-in first-out, each departure
follows from the previous one (Lindley's recursion)::

    depart[i] = max(arrive[i], depart[i-1]) + service[i]

With ``S`` the cumulative service this is ``depart[i] = S[i] + max_{j<=i}(arrive[j]
- S[j-1])``, so all the steps of a replay are served in one vectorized call,
with no simulation event per step or per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Served:
    """Departures of the messages, and the detokenizer's queue over time."""

    depart: np.ndarray
    queue_times: np.ndarray
    queue_lengths: np.ndarray


def serve_fifo(arrive: np.ndarray, service: np.ndarray) -> Served:
    """Serve messages arriving at ``arrive`` (sorted) that each take ``service`` seconds.

    The queue counts messages waiting, not in service, at each change; at equal
    times departures from the queue come first.
    """
    cum = np.cumsum(service)
    slack = np.empty_like(cum)  # first the service before each message
    slack[:1] = 0.0
    slack[1:] = cum[:-1]
    np.subtract(arrive, slack, out=slack)
    np.maximum.accumulate(slack, out=slack)
    depart = np.add(cum, slack, out=cum)
    del slack
    waited = np.flatnonzero(depart[:-1] > arrive[1:])  # message i + 1 waits for message i
    times = np.concatenate([arrive[waited + 1], depart[waited]])
    delta = np.concatenate([np.ones(len(waited), np.int64), -np.ones(len(waited), np.int64)])
    order = np.lexsort((delta, times))
    return Served(depart, times[order], np.cumsum(delta[order]))
