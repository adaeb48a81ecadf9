"""The SimPy model of the serving pipeline, driving the real scheduler core.

Stages of a request, each with its queue::

    arrival ─► frontend (queue) ─► IPC ─► tokenizer pool (queue) ─► IPC ─► scheduler (queue)
        ─► GPU steps ─► IPC ─► detokenizer (queue) ─► IPC ─► client

That is the ``split`` layout (``SimConfig.layout``); ``frontend`` tokenizes and
detokenizes in the frontend's process (``sim.model.frontend``,
``sim.model.delivery``), ``inline`` in the scheduler's loop
(``sim.model.scheduler_loop``): one hop each way instead of two.

The scheduler process is ``sim.model.scheduler_loop.SimSchedulerLoop``: it adds the requests
that reached the scheduler and makes the core's calls in the engine's order,
strict or overlapped, fast-forwarding runs of identical decode steps. What the
loop records is ``sim.model.replica.Replica``'s; a ``Pipeline`` is the one
replica of a single server (``sim.model.cluster`` runs several behind a router).

The stages before the scheduler push nothing back (with the frontend's intake and
streaming in separate queues: ``frontend_loop`` off, or recorded stages; with the
loop, one server runs as a cluster of one, ``sim.model.cluster``), so
``sim.model.frontend`` times them for every request before the run and one arrival
process feeds the scheduler. Token times: a step's tokens leave the engine when its plan is
completed, travel to the detokenizer (an exact FIFO queue), go one IPC hop to
the frontend and through its SSE streaming (another FIFO queue, ``stream`` cost
per token); that client time is what TTFT, ITL and E2E use. The loop records
which requests each step served and ``sim.model.delivery`` times them all after the
run.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import replace
from typing import Any

import numpy as np
import simpy

from schema.traces.record import TraceRequest
from sim.costs.base import CpuCosts, GpuCostModel
from sim.model.frontend import front_times
from sim.model.loop_settings import LoopSettings
from sim.model.recorded_stages import RecordedStages
from sim.model.replica import Progress, Replica, RequestRecords, Streams

FRONT_FIELDS = ("arrival", "parsed", "tokenizer_enter", "tokenize_start", "tokenized",
                "sched_arrival")  # fmt: skip
"""Times that ``sim.model.frontend`` computes before the run; the others fill in during it."""


def delay_to(now: float, t: float) -> float:
    """A delay ``d`` with ``now + d >= t`` in floats, landing on ``t`` or the float after it
    (where no delay from ``now`` reaches ``t`` exactly)."""
    d = t - now
    while now + d < t:
        d += math.ulp(now + d)
    return d


def _landing_times(times: list[float], start: float) -> list[float]:
    """The clock times at which a process starting at ``start`` that waits
    ``delay_to(now, t)`` for each of the sorted ``times`` in turn resumes."""
    out, now = [], start
    for t in times:
        if t > now:
            now = now + delay_to(now, t)
        out.append(now)
    return out


class Pipeline(Replica):
    """One replay on one server: build it, ``run()`` it, then read its per-request, step and
    queue records (the tables as ``streams`` took them)."""

    def __init__(
        self,
        requests: list[TraceRequest],
        scheduler: Any,
        gpu: GpuCostModel,
        cpu: CpuCosts,
        *,
        num_tokenizers: int = 1,
        loop: LoopSettings = LoopSettings(),
        progress: Progress | None = None,
        stages: RecordedStages | None = None,
        streams: Streams = Streams(),
    ) -> None:
        records = RequestRecords(requests, streams)
        self.front = front_times(requests, cpu, num_tokenizers, loop.layout)
        if stages is not None:  # a run's own intake and ways out (sim.model.recorded_stages)
            reached = stages.intake(self.front.sched_arrival, cpu.ipc)
            self.front = replace(self.front, sched_arrival=reached)
        for f in FRONT_FIELDS:
            records.times[f] = getattr(self.front, f)
        super().__init__(simpy.Environment(), records, scheduler, gpu, cpu, loop, progress)
        self.recorded_out = stages
        n = len(requests)
        self._not_arrived = n
        at = self.front.sched_arrival
        self._order = sorted(range(n), key=at.__getitem__)  # arrival order at the scheduler
        self._landed = _landing_times([at[i] for i in self._order], self.env.now)

    # ------------------------------------------------------------------ driving
    def run(self) -> None:
        self.env.process(self._arrivals())
        loop = self.env.process(self.loop.run())
        self.env.run(until=loop)
        self.finish()

    def _arrivals(self) -> Generator[simpy.Event, Any, None]:
        """Requests reach the scheduler at their ``sched_arrival`` (``sim.model.frontend``), as
        the clock can land on it (``delay_to``)."""
        env, at = self.env, self.front.sched_arrival
        for i in self._order:
            if at[i] > env.now:
                yield env.timeout(delay_to(env.now, at[i]))
            at[i] = env.now
            self._not_arrived -= 1
            self._inbox.append(i)
            self.sample_scheduler_queue(env.now)
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

    def next_arrival(self) -> float | None:
        """When the next request on its way reaches the scheduler (None: none is), known
        ahead because the arrivals process lands on precomputed times."""
        if not self._not_arrived:
            return None
        return self._landed[len(self._landed) - self._not_arrived]

    def nothing_to_come(self) -> bool:
        """No request is on its way to the scheduler."""
        return self._not_arrived == 0 and not self._inbox

    def front_queue_samples(self, stage: str) -> tuple[np.ndarray, np.ndarray]:
        return self.front.queue_samples(stage)
