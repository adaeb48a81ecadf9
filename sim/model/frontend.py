"""The stages before the scheduler, computed in closed form: frontend, IPC, tokenizer pool, IPC.

Nothing after the scheduler pushes back on these stages, so each request's
times follow from the trace alone, request by request in arrival order:

- the frontend is one FIFO server (one asyncio event loop) taking ``frontend``
  seconds a request: ``start = max(arrival, previous parsed)``, ``parsed =
  start + frontend``;
- the tokenizer pool is ``num_tokenizers`` FIFO servers, dealt requests round-robin
  as the frontend deals them (``engine.server.inlets.Inlet``): a request entering at
  ``parsed + ipc`` starts when its worker is free, ``tokenized = start +
  tokenize_time``: ``tokenize`` seconds a prompt token if the worker was idle, the
  back-to-back rate of as many busy workers (``CpuCosts.tokenize_time``) if it goes
  straight on from the prompt before;
- it reaches the scheduler at ``tokenized + ipc``.

That is the ``split`` layout. In the ``frontend`` layout the frontend's process
tokenizes (on a thread beside its loop, which it holds meanwhile): ``tokenized
= parsed + tokenize_time`` (back to back if the request waited for a tokenization),
the next request's intake waits for it,
and one hop takes the tokens to the scheduler (no tokenizer worker, no hop to
one). In the ``inline`` layout the text goes one hop from the frontend to the
scheduler, ``sched_arrival = parsed + ipc``, and the scheduler's loop tokenizes
it between two steps (``sim.model.replica``): its tokenize times are NaN here.

These are the times SimPy's ``Resource`` queues give, with the same float
operations, so the pipeline runs one arrival process instead of a process per
request. A request that has to wait for a server counts in that stage's queue
from its arrival at the stage until it starts.

With ``loop`` (the setting ``frontend_loop``) the frontend's one event loop also
streams every token, as the engine's does: each step's tokens reach it ``2 * ipc
+ detokenize * chunks`` after they leave the engine (the hops and the
detokenizer's work on them, not its queue) and take ``stream`` seconds a chunk
of the loop, served with the intakes first come, first served (at equal times the
chunks first). Then the intake depends on the steps, so it is timed during the
run (``FrontQueue.enter`` as requests arrive, the steps' chunks given to
``FrontQueue.stream`` as they are priced) and not by ``front_times``. Streaming
itself is still timed by ``sim.model.delivery`` in its own queue: the intakes it
leaves out are a small share of the loop beside the chunks (at the Azure edge on the
H200, a few percent where streaming takes about a tenth at a chunk's true cost).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
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
        return queue_samples(self.frontend_waits if stage == "frontend" else self.tokenizer_waits)


Leave = Sequence[float] | np.ndarray
"""Times at which steps' tokens leave the engine, in time order."""


class Streamed:
    """Steps whose tokens the frontend's loop streams: when each leaves the engine, how long
    its tokens take from there to the loop, what they cost the loop, and how many of the
    steps run (a decode run cut short runs fewer)."""

    __slots__ = ("cost", "delay", "leave", "runs")

    def __init__(self, leave: Leave, delay: float, cost: float) -> None:
        self.leave = leave
        self.delay = delay
        self.cost = cost
        self.runs = len(leave)

    def at(self, k: int) -> float:
        """When step ``k``'s tokens reach the loop."""
        return float(self.leave[k]) + self.delay

    def cut(self, runs: int) -> None:
        """Only the first ``runs`` steps run."""
        self.runs = min(self.runs, runs)


class FrontQueue:
    """The frontend and tokenizer pool of one server, fed one request at a time in arrival
    order (``enter``); ``front_times`` runs it over a whole trace, a simulated cluster's
    replica as the router places requests on it. It keeps the requests that waited. With
    ``loop``, its event loop also streams the steps given to ``stream`` (module docstring)."""

    def __init__(
        self, cpu: CpuCosts, num_tokenizers: int, loop: bool = False, layout: str = "split"
    ) -> None:
        self.frontend, self.ipc, self.tokenize_time = cpu.frontend, cpu.ipc, cpu.tokenize_time
        self.detokenize, self.stream_cost = cpu.detokenize, cpu.stream
        self.loop = loop
        self.layout = layout
        self.loop_free = -np.inf
        self._tokenized = -np.inf  # when the loop last finished a tokenization (``frontend``)
        self.workers = [-np.inf] * num_tokenizers  # when each worker is free again
        self._next_worker = 0  # the worker the next request is dealt to (round-robin)
        self.f_waits: tuple[list[float], list[float]] = ([], [])
        self.t_waits: tuple[list[float], list[float]] = ([], [])
        self._streams: list[tuple[float, int, Streamed, int]] = []  # (at, order, steps, step)
        self._order = 0

    def stream(self, leave: Leave, chunks: int) -> Streamed | None:
        """Steps whose tokens leave the engine at ``leave`` (in time order), ``chunks`` each:
        with ``loop``, the loop streams them (None without: nothing to cut)."""
        if not self.loop or not len(leave):
            return None
        cost = chunks * self.stream_cost
        if self.layout == "split":  # a hop to the detokenizer, its work, a hop to the frontend
            delay = 2 * self.ipc + self.detokenize * chunks
        else:  # one hop; the frontend's process detokenizes them (``frontend``) or they are text
            delay = self.ipc
            cost += chunks * self.detokenize if self.layout == "frontend" else 0.0
        steps = Streamed(leave, delay, cost)
        heapq.heappush(self._streams, (steps.at(0), self._order, steps, 0))
        self._order += 1
        return steps

    def _serve_streams(self, now: float) -> None:
        """The loop streams the steps that reached it by ``now``, in time order: a run's steps
        one after another up to the first step of another run's (or ``now``)."""
        heap = self._streams
        while heap and heap[0][0] <= now:
            _, order, steps, k = heapq.heappop(heap)
            until = min(now, heap[0][0]) if heap else now
            free, cost = self.loop_free, steps.cost
            while k < steps.runs:
                at = steps.at(k)
                if at > until:
                    break
                free = max(free, at) + cost
                k += 1
            self.loop_free = free
            if k < steps.runs:
                heapq.heappush(heap, (steps.at(k), order, steps, k))

    def enter(self, now: float, input_length: int) -> tuple[float, float, float, float, float]:
        """A request arriving at ``now``: (parsed, tokenizer_enter, tokenize_start, tokenized,
        sched_arrival)."""
        if self._streams:
            self._serve_streams(now)
        begin = now
        # straight on from the prompt before (``frontend``): the loop's last work tokenized
        busy = int(self.loop_free > now and self.loop_free == self._tokenized)
        if self.loop_free > now:
            self.f_waits[0].append(now)
            self.f_waits[1].append(self.loop_free)
            begin = self.loop_free
        parsed = self.loop_free = begin + self.frontend
        if self.layout == "frontend":  # the frontend's process tokenizes, then one hop
            done = self.loop_free = self._tokenized = parsed + self.tokenize_time(
                input_length, busy
            )
            return parsed, parsed, parsed, done, done + self.ipc
        if self.layout == "inline":  # the text goes one hop; the scheduler's loop tokenizes it
            reached = parsed + self.ipc
            return parsed, reached, np.nan, np.nan, reached
        entered = parsed + self.ipc
        worker = self._next_worker
        self._next_worker = (worker + 1) % len(self.workers)
        free = self.workers[worker]
        begin, busy = entered, 0
        if free > entered:  # it goes straight on from the prompt before: the busy rate
            self.t_waits[0].append(entered)
            self.t_waits[1].append(free)
            begin = free
            busy = sum(f > begin for f in self.workers) + 1
        done = self.workers[worker] = begin + self.tokenize_time(input_length, busy)
        return parsed, entered, begin, done, done + self.ipc

    def waits(self, stage: str) -> tuple[np.ndarray, np.ndarray]:
        """(arrival, start) of the requests that waited at ``stage``."""
        enter, start = self.f_waits if stage == "frontend" else self.t_waits
        return np.asarray(enter), np.asarray(start)


def queue_samples(waits: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(time, requests waiting) at each change, from the (arrival, start) of those that waited;
    at equal times, starts come before arrivals."""
    enter, start = waits
    times = np.concatenate([enter, start])
    delta = np.concatenate([np.ones(len(enter), np.int64), -np.ones(len(start), np.int64)])
    order = np.lexsort((delta, times))
    return times[order], np.cumsum(delta[order])


def front_times(
    requests: list[TraceRequest], cpu: CpuCosts, num_tokenizers: int, layout: str = "split"
) -> FrontTimes:
    """The stage times of ``requests`` (sorted by arrival); see the module docstring."""
    arrival, parsed, enter, start, tokenized, sched = (array("d") for _ in range(6))
    queue = FrontQueue(cpu, num_tokenizers, layout=layout)
    now = 0.0
    for r in requests:
        if r.arrival > now:
            now = now + (r.arrival - now)  # as SimPy's clock advances to the arrival
        arrival.append(now)
        p, e, s, t, a = queue.enter(now, r.input_length)
        parsed.append(p)
        enter.append(e)
        start.append(s)
        tokenized.append(t)
        sched.append(a)
    return FrontTimes(
        arrival,
        parsed,
        enter,
        start,
        tokenized,
        sched,
        queue.waits("frontend"),
        queue.waits("tokenizer"),
    )
