"""One simulated server behind the scheduler loop: what it records of its requests and steps.

A ``Replica`` is the ``LoopHost`` of one ``SimSchedulerLoop``: it adds the
requests that reached its scheduler, records each step and the tokens it
gave, and times the token deliveries after the run (``sim.model.delivery``).
How requests reach the scheduler is the subclass's: ``Pipeline`` (one server,
its stages before the scheduler in closed form) or ``ClusterReplica`` (one of
several behind the router, fed as the router places requests).

Per-request records (``RequestRecords``, by index in the trace) are shared by
the replicas of a cluster: each request is written by the one replica that
serves it.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
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
from core.scheduler.shape import StepShape
from schema.metrics import SERVER_TOKEN_COLUMNS, TIME_COLUMNS
from schema.samples import WeightedSamples
from schema.steplog import StepLog
from schema.traces.record import TraceRequest
from sim.costs.base import CpuCosts, GpuCostModel
from sim.model.delivery import Delivered, TokenDelivery
from sim.model.recorded_stages import RecordedStages
from sim.model.scheduler_loop import LoopSettings, SimSchedulerLoop

NAN = math.nan
TIME_FIELDS = (*TIME_COLUMNS, "parsed", "tokenizer_enter", *SERVER_TOKEN_COLUMNS)
"""Every stage time a request records: ``requests.csv``'s, the two that only its ``*_ms``
columns show, and the server's times of its first and last token."""


class Progress:
    """What the pipeline reports as requests end (a tqdm bar, or nothing)."""

    def update(self, n: int) -> None:
        pass


class RequestRecords:
    """Per request (trace order): stage times, status, cached tokens, preemptions, and the
    delivery steps of its first and last token (in its replica's delivery)."""

    def __init__(self, requests: list[TraceRequest]) -> None:
        n = len(requests)
        self.trace = requests
        self.index = {r.rid: i for i, r in enumerate(requests)}
        self.times: dict[str, Any] = {f: array("d", [NAN]) * n for f in TIME_FIELDS}
        self.status = ["pending"] * n
        self.reason = [""] * n
        self.cached_tokens = [0] * n
        self.preemptions = [0] * n
        self.first_step = [-1] * n  # delivery step of each request's first token
        self.finish_step = [-1] * n  # delivery step that finished it, if it carried tokens


class Replica:
    """One server's scheduler and what it records; subclasses bring the requests to it."""

    def __init__(
        self,
        env: simpy.Environment,
        records: RequestRecords,
        scheduler: Any,
        gpu: GpuCostModel,
        cpu: CpuCosts,
        loop: LoopSettings,
        progress: Progress | None,
    ) -> None:
        self.env = env
        self.records = records
        self.trace = records.trace
        self.index = records.index
        self.times = records.times
        self.status = records.status
        self.reason = records.reason
        self.cached_tokens = records.cached_tokens
        self.preemptions = records.preemptions
        self.first_step = records.first_step
        self.finish_step = records.finish_step
        self.sched = scheduler
        self.gpu = gpu
        self.cpu = cpu
        self.progress = progress or Progress()
        self.reqs: dict[int, Request] = {}  # requests the core holds, by index
        self.steps = StepLog(scheduler.config.pages)
        self.delivery = TokenDelivery(len(records.trace), cpu.ipc, cpu.detokenize, cpu.stream)
        self.delivered: Delivered | None = None
        self.recorded_out: RecordedStages | None = None  # recorded ways out (the subclass's)
        self.queue_samples: list[tuple[float, str, int]] = []
        self._sched_waiting = -1
        self._inbox: list[int] = []
        self._wake: simpy.Event | None = None
        self.loop = SimSchedulerLoop(env, scheduler, gpu, cpu, self, loop)

    # ------------------------------------------------------------------ the subclass's
    def next_arrival(self) -> float | None:
        """When the next request known to be on its way reaches the scheduler (None: none)."""
        raise NotImplementedError

    def nothing_to_come(self) -> bool:
        """No request is on its way to the scheduler, nor can one come any more."""
        raise NotImplementedError

    def members(self) -> Iterable[int]:
        """The indices of the requests this replica served."""
        raise NotImplementedError

    def front_queue_samples(self, stage: str) -> tuple[np.ndarray, np.ndarray]:
        """(time, requests waiting) of the ``frontend`` or ``tokenizer`` stage at each change."""
        raise NotImplementedError

    def ended(self, i: int, rejected: bool) -> None:
        """Request ``i`` finished, or was rejected, at the scheduler (now)."""
        self.progress.update(1)

    # ------------------------------------------------------------------ for the scheduler loop
    def wait_for_arrival(self) -> simpy.Event:
        self._wake = self.env.event()
        return self._wake

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
                self.ended(i, True)
                continue
            self.reqs[i] = req
        self._inbox = []

    def note_scheduled(self, plan: Plan) -> None:
        """First admission of a request: when (the core's stamp) and its prefix-cache hit."""
        first = self.times["first_scheduled"]
        for chunk in plan.prefill:
            i = self.index[chunk.rid]
            req = self.reqs.get(i)
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
        """Count a step's events; its tokens are timed to the client by ``deliver``."""
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
                del self.reqs[i]  # the core has let go of it; its token list can go too
                self.ended(i, False)
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

    def sample_scheduler_queue(self, now: float) -> None:
        waiting = self.sched.num_waiting + len(self._inbox)
        if waiting != self._sched_waiting:
            self._sched_waiting = waiting
            self.queue_samples.append((now, "scheduler", waiting))

    # ------------------------------------------------------------------ results
    def deliver(self) -> None:
        """Time the recorded token deliveries; fill the client-side times of its requests and
        the server's times of their first and last token. With ``recorded_out``, a request's
        client times are its server times plus its recorded ways out, where recorded."""
        server = self.delivery.step_ends()
        delivered = self.delivered = self.delivery.deliver()
        client = delivered.client
        t = self.times
        first_token, finished = t["first_token"], t["finished"]
        server_first, server_last = t["server_first_token"], t["server_last_token"]
        first_step, finish_step = self.first_step, self.finish_step
        for i in self.members():
            g = first_step[i]
            if g >= 0:
                first_token[i] = float(client[g])
                server_first[i] = float(server[g])
            g = finish_step[i]
            if g >= 0:
                finished[i] = float(client[g])
                server_last[i] = float(server[g])
        if self.recorded_out is not None:
            self.recorded_out.deliver(t, self.members())

    def itl(self) -> WeightedSamples:
        """Pooled gaps between consecutive streamed chunks of each request (after the run)."""
        if self.delivered is None:
            raise RuntimeError("itl() before run()")
        return self.delivered.itl_s
