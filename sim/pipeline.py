"""The SimPy model of the serving pipeline, driving the real scheduler core.

Stages of a request, each with its queue::

    arrival ─► frontend (queue) ─► IPC ─► tokenizer pool (queue) ─► IPC ─► scheduler (queue)
        ─► GPU steps ─► IPC ─► detokenizer (queue) ─► IPC ─► client

The engine loop is one SimPy process: it adds the requests that reached the
scheduler, calls ``schedule(now)``, waits the step's cost-model time (GPU plus
scheduler CPU, or their max with overlap scheduling), then ``complete``. When
the core says the next k steps are identical pure-decode steps, the loop prices
all k with numpy and waits for the run's end or for a new request reaching the
scheduler, whichever comes first; interrupted at t, it applies the steps that
started before t (the one in flight included) and carries on. Decisions and
times equal those of stepping one by one.

The stages before the scheduler push nothing back, so ``sim.frontend`` times
them for every request before the run and one arrival process feeds the
scheduler. Token times: a step's tokens leave the GPU at the step's end,
travel to the detokenizer (an exact FIFO queue) and reach the client one IPC
hop later; that client time is what TTFT, ITL and E2E use. The loop records
which requests each step served and ``sim.delivery`` times them all after the
run.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from engine.scheduler import (
    Finished,
    Plan,
    Preempted,
    Request,
    RequestRejected,
    TokenOut,
)
from sim.costs.base import CpuCosts, GpuCostModel, StepShape
from sim.delivery import Delivered, TokenDelivery
from sim.frontend import front_times
from sim.samples import WeightedSamples
from sim.steplog import StepLog
from sim.traces.record import TraceRequest

NAN = math.nan
FRONT_FIELDS = ("arrival", "parsed", "tokenizer_enter", "tokenize_start", "tokenized",
                "sched_arrival")  # fmt: skip
"""Times that ``sim.frontend`` computes before the run; the others fill in during it."""
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
        overlap: bool = False,
        fast_forward: bool = True,
        max_run_steps: int = 4096,
        progress: Progress | None = None,
    ) -> None:
        self.env = simpy.Environment()
        self.trace = requests
        self.sched = scheduler
        self.gpu = gpu
        self.cpu = cpu
        self.overlap = overlap
        self.fast_forward = fast_forward
        self.max_run_steps = max_run_steps
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
        self.steps = StepLog(scheduler.config.num_pages)
        self.delivery = TokenDelivery(n, cpu.ipc, cpu.detokenize)
        self.first_step = [-1] * n  # delivery step of each request's first token
        self.finish_step = [-1] * n  # delivery step that finished it, if it carried tokens
        self.delivered: Delivered | None = None
        self.queue_samples: list[tuple[float, str, int]] = []
        self._sched_waiting = -1
        self._inbox: list[int] = []
        self._wake: simpy.Event | None = None
        self._not_arrived = n
        self._done = 0
        self.num_runs = 0
        self.steps_in_runs = 0

    # ------------------------------------------------------------------ driving
    def run(self) -> None:
        self.env.process(self._arrivals())
        engine = self.env.process(self._engine())
        self.env.run(until=engine)
        self._deliver()

    def _arrivals(self) -> Generator[simpy.Event, Any, None]:
        """Requests reach the scheduler at their ``sched_arrival`` (``sim.frontend``), as
        the clock can land on it (``_delay_to``)."""
        env, at = self.env, self.front.sched_arrival
        for i in sorted(range(len(at)), key=at.__getitem__):
            if at[i] > env.now:
                yield env.timeout(_delay_to(env.now, at[i]))
            at[i] = env.now
            self._not_arrived -= 1
            self._inbox.append(i)
            self._sample_scheduler_queue(env.now)
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

    def _wait_for_arrival(self) -> simpy.Event:
        self._wake = self.env.event()
        return self._wake

    # ------------------------------------------------------------------ engine loop
    def _engine(self) -> Generator[simpy.Event, Any, None]:
        env, s = self.env, self.sched
        while True:
            if self._inbox:
                self._admit_inbox()
            if not s.has_work():
                if self._not_arrived == 0 and not self._inbox:
                    return
                yield self._wait_for_arrival()
                continue
            if self.fast_forward:
                k = s.decode_run_length(self.max_run_steps)
                if k >= 2:
                    yield from self._decode_run(k)
                    continue
            plan = s.schedule(env.now)
            self._sample_scheduler_queue(env.now)
            if not plan.has_model_work:
                self._handle_events(plan, s.complete(plan, None), env.now)
                if s.has_work() and self._not_arrived == 0 and not self._inbox:
                    raise RuntimeError(
                        f"the scheduler makes no progress at t={env.now:.6f}: "
                        f"{s.num_waiting} waiting, {s.num_running} running, nothing arriving"
                    )
                if s.has_work():
                    yield self._wait_for_arrival()
                continue
            yield from self._step(plan)

    def _admit_inbox(self) -> None:
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

    def _step(self, plan: Plan) -> Generator[simpy.Event, Any, None]:
        env, s = self.env, self.sched
        start = env.now
        shape = StepShape.of_plan(plan)
        gpu = self.gpu.step_time(shape)
        cpu = self.cpu.schedule_time(plan.batch_size)
        duration = max(gpu, cpu) if self.overlap else gpu + cpu
        stats = s.stats()
        for chunk in plan.prefill:
            i = self.index[chunk.rid]
            if math.isnan(self.times["first_scheduled"][i]):
                self.times["first_scheduled"][i] = start
                req = self.reqs[i]
                self.cached_tokens[i] = req.num_cached if req is not None else 0
        yield env.timeout(duration)
        events = s.complete(plan, None)
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
            plan.blocked,
            stats.cached_tokens,
            stats.prompt_tokens,
        )
        self._handle_events(plan, events, env.now)

    def _handle_events(self, plan: Plan, events: list[Any], end: float) -> None:
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

    def _end_request(self) -> None:
        self._done += 1
        self.progress.update(1)

    def _sample_scheduler_queue(self, now: float) -> None:
        waiting = self.sched.num_waiting + len(self._inbox)
        if waiting != self._sched_waiting:
            self._sched_waiting = waiting
            self.queue_samples.append((now, "scheduler", waiting))

    # ------------------------------------------------------------------ decode runs
    def _decode_run(self, k: int) -> Generator[simpy.Event, Any, None]:
        env, s = self.env, self.sched
        now = env.now
        running = list(s.running.values())
        batch = len(running)
        context = sum(r.num_computed for r in running)
        gpu = self.gpu.decode_times(batch, context + batch, k)
        cpu = self.cpu.schedule_time(batch)
        durations = np.maximum(gpu, cpu) if self.overlap else gpu + cpu
        clock = np.cumsum(np.concatenate(([now], durations)))
        starts, ends = clock[:-1], clock[1:]
        j = k
        if self._not_arrived > 0 or self._inbox:
            wake = self._wait_for_arrival()
            done = env.timeout(float(ends[-1]) - now)
            yield wake | done
            if not done.processed:
                j = max(1, int(np.searchsorted(starts, env.now, side="left")))
        stats = s.stats()
        run = s.advance_decode(j, now)
        if run.context_tokens != context or run.rids != tuple(r.rid for r in running):
            raise RuntimeError("decode run differs from the running set the sim priced")
        self.num_runs += 1
        if env.now < ends[j - 1]:
            yield env.timeout(float(ends[j - 1]) - env.now)
        self._record_run(run, starts[:j], durations[:j], stats)

    def _record_run(self, run: Any, starts: np.ndarray, durations: np.ndarray, stats: Any) -> None:
        j = run.k
        self.steps_in_runs += j
        batch = len(run.rids)
        index = self.index
        self.delivery.run(starts + durations, [index[rid] for rid in run.rids])
        self.steps.add_run(
            run.first_step,
            starts,
            durations,
            batch,
            run.context_tokens,
            stats.pages_held,
            run.new_pages,
            stats.num_waiting,
            stats.num_running,
            run.blocked,
            stats.cached_tokens,
            stats.prompt_tokens,
        )

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
