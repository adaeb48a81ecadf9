"""The SimPy model of the serving pipeline, driving the real scheduler core.

Stages of a request, each with its queue::

    arrival ─► frontend (queue) ─► IPC ─► tokenizer pool (queue) ─► IPC ─► scheduler (queue)
        ─► GPU steps ─► IPC ─► detokenizer (queue) ─► IPC ─► client

The scheduler process is ``sim.model.scheduler_loop.SimSchedulerLoop``: it adds the requests
that reached the scheduler and makes the core's calls in the engine's order,
strict or overlapped, fast-forwarding runs of identical decode steps.

The stages before the scheduler push nothing back, so ``sim.model.frontend`` times
them for every request before the run and one arrival process feeds the
scheduler. Token times: a step's tokens leave the engine when its plan is
completed, travel to the detokenizer (an exact FIFO queue), go one IPC hop to
the frontend and through its SSE streaming (another FIFO queue, ``stream`` cost
per token); that client time is what TTFT, ITL and E2E use. The loop records
which requests each step served and ``sim.model.delivery`` times them all after the
run.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from core.scheduler import (
    DecodeRun,
    Finished,
    Plan,
    Preempted,
    Request,
    RequestRejected,
    SchedulerStats,
    TokenOut,
)
from schema.samples import WeightedSamples
from schema.steplog import StepLog
from schema.traces.record import TraceRequest
from sim.costs.base import CpuCosts, GpuCostModel, StepShape
from sim.model.delivery import Delivered, TokenDelivery
from sim.model.frontend import front_times
from sim.model.scheduler_loop import LoopSettings, SimSchedulerLoop

NAN = math.nan
FRONT_FIELDS = ("arrival", "parsed", "tokenizer_enter", "tokenize_start", "tokenized",
                "sched_arrival")  # fmt: skip
"""Times that ``sim.model.frontend`` computes before the run; the others fill in during it."""
TIME_FIELDS = (
    "arrival",
    "parsed",
    "tokenizer_enter",
    "tokenize_start",
    "tokenized",
    "sched_arrival",
    "first_scheduled",
    "first_token",
    "finished",
)


def _delay_to(now: float, t: float) -> float:
    """A delay ``d`` with ``now + d >= t`` in floats, landing on ``t`` or the float after it
    (where no delay from ``now`` reaches ``t`` exactly)."""
    d = t - now
    while now + d < t:
        d += math.ulp(now + d)
    return d


def _landing_times(times: list[float], start: float) -> list[float]:
    """The clock times at which a process starting at ``start`` that waits
    ``_delay_to(now, t)`` for each of the sorted ``times`` in turn resumes."""
    out, now = [], start
    for t in times:
        if t > now:
            now = now + _delay_to(now, t)
        out.append(now)
    return out


class Progress:
    """What the pipeline reports as requests end (a tqdm bar, or nothing)."""

    def update(self, n: int) -> None:
        pass


class Pipeline:
    """One replay: build it, ``run()`` it, then read its per-request, step and queue records."""

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
    ) -> None:
        self.env = simpy.Environment()
        self.trace = requests
        self.sched = scheduler
        self.gpu = gpu
        self.cpu = cpu
        self.progress = progress or Progress()
        self.front = front_times(requests, cpu, num_tokenizers)
        n = len(requests)
        self.index = {r.rid: i for i, r in enumerate(requests)}
        self.times: dict[str, Any] = {f: array("d", [NAN]) * n for f in TIME_FIELDS}
        for f in FRONT_FIELDS:
            self.times[f] = getattr(self.front, f)
        self.status = ["pending"] * n
        self.reason = [""] * n
        self.cached_tokens = [0] * n
        self.preemptions = [0] * n
        self.reqs: list[Request | None] = [None] * n
        self.steps = StepLog(scheduler.config.pages)
        self.delivery = TokenDelivery(n, cpu.ipc, cpu.detokenize, cpu.stream)
        self.first_step = [-1] * n  # delivery step of each request's first token
        self.finish_step = [-1] * n  # delivery step that finished it, if it carried tokens
        self.delivered: Delivered | None = None
        self.queue_samples: list[tuple[float, str, int]] = []
        self._sched_waiting = -1
        self._inbox: list[int] = []
        self._wake: simpy.Event | None = None
        self._not_arrived = n
        at = self.front.sched_arrival
        self._order = sorted(range(n), key=at.__getitem__)  # arrival order at the scheduler
        self._landed = _landing_times([at[i] for i in self._order], self.env.now)
        self.loop = SimSchedulerLoop(self.env, scheduler, gpu, cpu, self, loop)

    # ------------------------------------------------------------------ driving
    def run(self) -> None:
        self.env.process(self._arrivals())
        loop = self.env.process(self.loop.run())
        self.env.run(until=loop)
        self._deliver()

    def _arrivals(self) -> Generator[simpy.Event, Any, None]:
        """Requests reach the scheduler at their ``sched_arrival`` (``sim.model.frontend``), as
        the clock can land on it (``_delay_to``)."""
        env, at = self.env, self.front.sched_arrival
        for i in self._order:
            if at[i] > env.now:
                yield env.timeout(_delay_to(env.now, at[i]))
            at[i] = env.now
            self._not_arrived -= 1
            self._inbox.append(i)
            self.sample_scheduler_queue(env.now)
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

    def wait_for_arrival(self) -> simpy.Event:
        self._wake = self.env.event()
        return self._wake

    def next_arrival(self) -> float | None:
        """When the next request on its way reaches the scheduler (None: none is), known
        ahead because the arrivals process lands on precomputed times."""
        if not self._not_arrived:
            return None
        return self._landed[len(self._landed) - self._not_arrived]

    # ------------------------------------------------------------------ for the scheduler loop
    def nothing_to_come(self) -> bool:
        """No request is on its way to the scheduler."""
        return self._not_arrived == 0 and not self._inbox

    def admit_inbox(self) -> None:
        """Add the requests that reached the scheduler; reject those it can never serve."""
        s, times = self.sched, self.times
        for i in self._inbox:
            tr = self.trace[i]
            req = Request(
                rid=tr.rid,
                prompt_len=tr.input_length,
                max_new_tokens=tr.output_length,
                arrival=tr.arrival,
                block_hashes=list(tr.hash_ids),
                block_size=512,
                priority=tr.priority,
                expected_output_len=tr.output_length,
            )
            try:
                s.add(req)
            except RequestRejected as exc:
                self.status[i] = "rejected"
                self.reason[i] = str(exc)
                times["finished"][i] = self.env.now
                self._end_request()
                continue
            self.reqs[i] = req
        self._inbox = []

    def note_scheduled(self, plan: Plan) -> None:
        """First admission of a request: when (the core's stamp) and its prefix-cache hit."""
        first = self.times["first_scheduled"]
        for chunk in plan.prefill:
            i = self.index[chunk.rid]
            req = self.reqs[i]
            if math.isnan(first[i]) and req is not None and req.first_scheduled is not None:
                first[i] = req.first_scheduled
                self.cached_tokens[i] = req.num_cached

    def record_step(
        self, plan: Plan, shape: StepShape, start: float, duration: float, stats: SchedulerStats
    ) -> None:
        self.steps.add(
            plan.step,
            start,
            duration,
            plan.batch_size,
            shape.prefill_tokens,
            shape.decode_requests,
            shape.context_tokens,
            stats.pages_held,
            stats.num_waiting,
            stats.num_running,
            len(plan.preempted),
            plan.blocked.value,
            stats.cached_tokens,
            stats.prompt_tokens,
        )

    def handle_events(self, plan: Plan, events: list[Any], end: float) -> None:
        """Count a step's events; its tokens are timed to the client by ``_deliver``."""
        g = self.delivery.num_steps
        members: list[int] = []
        finished: list[int] = []
        index, times = self.index, self.times
        for e in events:
            i = index[e.rid]
            kind = type(e)
            if kind is TokenOut:
                members.append(i)
                if e.first:
                    self.first_step[i] = g
            elif kind is Finished:
                finished.append(i)
                times["finished"][i] = end
                self.status[i] = "completed"
                self.reqs[i] = None  # the core has let go of it; its token list can go too
                self._end_request()
            elif kind is Preempted:
                self.preemptions[i] += 1
        if members:
            self.delivery.step(end, members)
            for i in finished:
                self.finish_step[i] = g

    def record_run(
        self, run: DecodeRun, starts: np.ndarray, durations: np.ndarray, stats: SchedulerStats
    ) -> None:
        """Step rows of a decode run's ``run.k`` steps."""
        self.steps.add_run(
            run.first_step,
            starts,
            durations,
            len(run.rids),
            run.context_tokens,
            stats.pages_held,
            run.new_pages,
            stats.num_waiting,
            stats.num_running,
            run.blocked.value,
            stats.cached_tokens,
            stats.prompt_tokens,
        )

    def tokens_of_run(self, rids: tuple[str, ...], leave: np.ndarray) -> None:
        """One token per request in ``rids`` leaving the engine at each time of ``leave``."""
        index = self.index
        self.delivery.run(leave, [index[rid] for rid in rids])

    def _end_request(self) -> None:
        self.progress.update(1)

    def sample_scheduler_queue(self, now: float) -> None:
        waiting = self.sched.num_waiting + len(self._inbox)
        if waiting != self._sched_waiting:
            self._sched_waiting = waiting
            self.queue_samples.append((now, "scheduler", waiting))

    # ------------------------------------------------------------------ results
    def _deliver(self) -> None:
        """Time the recorded token deliveries; fill the client-side times of each request."""
        delivered = self.delivered = self.delivery.deliver()
        client = delivered.client
        first_token, finished = self.times["first_token"], self.times["finished"]
        for i, g in enumerate(self.first_step):
            if g >= 0:
                first_token[i] = float(client[g])
        for i, g in enumerate(self.finish_step):
            if g >= 0:
                finished[i] = float(client[g])

    def itl(self) -> WeightedSamples:
        """Pooled gaps between consecutive streamed chunks of each request (after ``run``)."""
        if self.delivered is None:
            raise RuntimeError("itl() before run()")
        return self.delivered.itl_s
