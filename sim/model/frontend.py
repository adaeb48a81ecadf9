"""The stages before the scheduler, computed in closed form: frontend, IPC, tokenizer pool, IPC.

Nothing after the scheduler pushes back on these stages, so each request's
times follow from the trace alone, request by request in arrival order:

- the frontend is one FIFO server (one asyncio event loop) taking ``frontend``
  seconds a request: ``start = max(arrival, previous parsed)``, ``parsed =
  start + frontend``;
- the tokenizer pool is ``num_tokenizers`` FIFO servers taking ``tokenize``
  seconds a prompt token: a request entering at ``parsed + ipc`` starts on the
  first worker to become free, ``tokenized = start + tokenize * input_length``;
- it reaches the scheduler at ``tokenized + ipc``.

These are the times SimPy's ``Resource`` queues give, with the same float
operations, so the pipeline runs one arrival process instead of a process per
request. A request that has to wait for a server counts in that stage's queue
from its arrival at the stage until it starts.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass

import numpy as np

from schema.traces.record import TraceRequest
from sim.costs.base import CpuCosts


@dataclass(frozen=True, slots=True)
class FrontTimes:
    """Per request (trace order): the times of each stage, in seconds from the trace start."""

    arrival: array[float]
    parsed: array[float]
    tokenizer_enter: array[float]
    tokenize_start: array[float]
    tokenized: array[float]
    sched_arrival: array[float]
    frontend_waits: tuple[np.ndarray, np.ndarray]  # (arrival, start) of requests that waited
    tokenizer_waits: tuple[np.ndarray, np.ndarray]

    def queue_samples(self, stage: str) -> tuple[np.ndarray, np.ndarray]:
        """(time, requests waiting) of ``stage`` (``frontend`` or ``tokenizer``) at each change;
        at equal times, starts come before arrivals."""
        enter, start = self.frontend_waits if stage == "frontend" else self.tokenizer_waits
        times = np.concatenate([enter, start])
        delta = np.concatenate([np.ones(len(enter), np.int64), -np.ones(len(start), np.int64)])
        order = np.lexsort((delta, times))
        return times[order], np.cumsum(delta[order])


def front_times(requests: list[TraceRequest], cpu: CpuCosts, num_tokenizers: int) -> FrontTimes:
    """The stage times of ``requests`` (sorted by arrival); see the module docstring."""
    arrival, parsed, enter, start, tokenized, sched = (array("d") for _ in range(6))
    f_waits: tuple[list[float], list[float]] = ([], [])
    t_waits: tuple[list[float], list[float]] = ([], [])
    now = 0.0
    loop_free = -np.inf
    workers = [-np.inf] * num_tokenizers  # when each worker is free again (a heap)
    frontend, ipc, tokenize = cpu.frontend, cpu.ipc, cpu.tokenize
    for r in requests:
        if r.arrival > now:
            now = now + (r.arrival - now)  # as SimPy's clock advances to the arrival
        arrival.append(now)
        begin = now
        if loop_free > now:
            f_waits[0].append(now)
            f_waits[1].append(loop_free)
            begin = loop_free
        loop_free = begin + frontend
        parsed.append(loop_free)
        entered = loop_free + ipc
        enter.append(entered)
        free = heapq.heappop(workers)
        begin = entered
        if free > entered:
            t_waits[0].append(entered)
            t_waits[1].append(free)
            begin = free
        done = begin + tokenize * r.input_length
        heapq.heappush(workers, done)
        start.append(begin)
        tokenized.append(done)
        sched.append(done + ipc)
    return FrontTimes(
        arrival,
        parsed,
        enter,
        start,
        tokenized,
        sched,
        (np.asarray(f_waits[0]), np.asarray(f_waits[1])),
        (np.asarray(t_waits[0]), np.asarray(t_waits[1])),
    )
