"""One simulated server behind the scheduler loop: what it records of its requests and steps.

A ``Replica`` is the ``LoopHost`` of one ``SimSchedulerLoop``: it adds the
requests that reached its scheduler, records each step and the tokens it
gave, and times the token deliveries after the run (``sim.model.delivery``).
How requests reach the scheduler is the subclass's: ``Pipeline`` (one server,
its stages before the scheduler in closed form) or ``ClusterReplica`` (one of
several behind the router, fed as the router places requests).

Per-request records (``RequestRecords``, by index in the trace) are shared by
the replicas of a cluster: each request is written by the one replica that
serves it. Every ``Streams.flush_steps`` steps a replica writes its step rows
out and times its token deliveries so far; the requests that became final
then, in trace order up to the first that is not, go to ``Streams.requests``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
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
from schema.steplog import StepLog
from schema.tables import MemoryTable, TableWriter
from schema.traces.record import HASH_BLOCK_TOKENS, TraceRequest
from sim.costs.base import CpuCosts, GpuCostModel
from sim.model.delivery import RequestTotals, TokenDelivery
from sim.model.frontend import Leave, Streamed
from sim.model.loop_settings import LoopSettings
from sim.model.recorded_stages import RecordedStages
from sim.model.scheduler_loop import SimSchedulerLoop

NAN = math.nan
TIME_FIELDS = (*TIME_COLUMNS, "parsed", "tokenizer_enter", *SERVER_TOKEN_COLUMNS)
"""Every stage time a request records: ``requests.csv``'s, the two that only its ``*_ms``
columns show, and the server's times of its first and last token."""


class Progress:
    """What the pipeline reports as requests end (a tqdm bar, or nothing)."""

    def update(self, n: int) -> None:
        pass


FLUSH_STEPS = 1 << 18
"""Steps between two writes of a replica's tables (memory holds about one chunk of them)."""


@dataclass(frozen=True, slots=True)
class Streams:
    """Where a replay's tables go as it runs: each replica's step table (a new writer per
    replica), the rows ``[a, b)`` of the trace that became final (``requests``), and how
    many steps a replica records between two writes."""

    step_table: Callable[[], TableWriter] = MemoryTable
    requests: Callable[[int, int], None] = field(default=lambda a, b: None)
    flush_steps: int = FLUSH_STEPS


class RequestRecords:
    """Per request (trace order): stage times, status, cached tokens, preemptions, the
    delivery steps of its first and last token (in its replica's delivery), what its
    deliveries add up to (``totals``), and whether its record is final (``done``)."""

    def __init__(self, requests: list[TraceRequest], streams: Streams = Streams()) -> None:
        n = len(requests)
        self.trace = requests
        self.streams = streams
        self.index = {r.rid: i for i, r in enumerate(requests)}
        self.times: dict[str, Any] = {f: np.full(n, NAN) for f in TIME_FIELDS}
        self.status = ["pending"] * n
        self.reason = [""] * n
        self.cached_tokens = [0] * n
        self.preemptions = [0] * n
        self.first_step = np.full(n, -1, dtype=np.int64)  # delivery step of its first token
        self.finish_step = np.full(n, -1, dtype=np.int64)  # the step that finished it
        self.totals = RequestTotals(n)
        self.done = np.zeros(n, dtype=bool)
        self.written = 0  # requests [0, written) went to ``streams.requests``

    def write_final(self) -> None:
        """Hand on the requests from ``written`` up to the first that is not final."""
        rest = self.done[self.written :]  # no copy: this runs at every flush of a long run
        end = len(self.done) if rest.all() else self.written + int(np.argmin(rest))
        if end > self.written:
            self.streams.requests(self.written, end)
            self.written = end


class Replica:
    """One server's scheduler and what it records; subclasses bring the requests to it."""

    transfers_kv = False  # a PD role moves KV between servers (its step record counts it)

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
        self.flush_steps = records.streams.flush_steps
        self.steps = StepLog(scheduler.config.pages, records.streams.step_table(), self.flush_steps)
        self.delivery = TokenDelivery(
            records.totals, cpu.ipc, cpu.detokenize, cpu.stream, layout=loop.layout
        )
        self.tokenizes = loop.layout == "inline"  # the scheduler's loop tokenizes its arrivals
        self.finished_run = False
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

    def admit_inbox(self) -> float:
        """Add the requests that reached the scheduler; reject those it can never serve.
        Returns how long the loop takes them in: in the ``inline`` layout it tokenizes each,
        one after another from now (``tokenize_start``, ``tokenized`` and ``sched_arrival``:
        when it joins the core's queue); 0 in the others."""
        s, times = self.sched, self.times
        now = at = self.env.now
        for n, i in enumerate(self._inbox):
            tr = self.trace[i]
            if self.tokenizes:  # the first after the loop's other work, the rest back to back
                times["tokenize_start"][i] = at
                at = at + self.cpu.tokenize_time(tr.input_length, min(n, 1))
                times["tokenized"][i] = times["sched_arrival"][i] = at
            self.queue_request(i, s.add, at)
        self._inbox = []
        return at - now

    def queue_request(self, i: int, add: Callable[[Request], None], at: float) -> bool:
        """Hand trace request ``i`` to the core with ``add`` (``add``, or a role's own); if the
        core rejects it, record it rejected at ``at`` and end it. Whether it was queued."""
        tr = self.trace[i]
        req = Request(
            rid=tr.rid,
            prompt_len=tr.input_length,
            max_new_tokens=tr.output_length,
            arrival=tr.arrival,
            block_hashes=list(tr.hash_ids),
            block_size=HASH_BLOCK_TOKENS,
            priority=tr.priority,
            expected_output_len=tr.output_length,
        )
        try:
            add(req)
        except RequestRejected as exc:
            self.status[i] = "rejected"
            self.reason[i] = str(exc)
            self.times["finished"][i] = at
            self.records.done[i] = True
            self.ended(i, True)
            return False
        self.reqs[i] = req
        return True

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
        """Count a step's events; its tokens are timed to the client by ``deliver`` (a request's
        tokens of one step, several after a verified draft, go in one chunk)."""
        g = self.delivery.num_steps
        members: list[int] = []
        extra: list[int] = []  # one more token of the chunk of a request (a verified draft)
        finished: list[int] = []
        index, times = self.index, self.times
        for e in events:
            i = index[e.rid]
            kind = type(e)
            if kind is TokenOut:
                if members and members[-1] == i:  # a slot's tokens come one after another
                    extra.append(i)
                else:
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
            self.delivery.step(end, members, extra)
            self.stream_tokens((end,), len(members))
            for i in finished:
                self.finish_step[i] = g
        else:
            self.records.done[finished] = True
        if self.delivery.pending >= self.flush_steps:
            self.deliver()

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
        if self.delivery.pending >= self.flush_steps:
            self.deliver()

    def stream_tokens(self, leave: Leave, chunks: int) -> Streamed | None:
        """Steps whose tokens (``chunks`` each) leave the engine at ``leave``, for a frontend
        whose loop streams them (``sim.model.frontend``; None: none here)."""
        return None

    def sample_scheduler_queue(self, now: float) -> None:
        waiting = self.sched.num_waiting + len(self._inbox)
        if waiting != self._sched_waiting:
            self._sched_waiting = waiting
            self.queue_samples.append((now, "scheduler", waiting))

    # ------------------------------------------------------------------ results
    def deliver(self) -> None:
        """Time the token deliveries recorded so far; fill the client-side times of the
        requests they served and the server's times of their first and last token, and hand
        on the requests that became final. With ``recorded_out``, a request's client times
        are its server times plus its recorded ways out, where recorded."""
        chunk = self.delivery.flush()
        end = chunk.first_step + len(chunk.client)
        served = np.unique(chunk.members)
        for steps, column, server_column in (
            (self.first_step, "first_token", "server_first_token"),
            (self.finish_step, "finished", "server_last_token"),
        ):
            g = steps[served]
            here = (g >= chunk.first_step) & (g < end)
            at = g[here] - chunk.first_step
            self.times[column][served[here]] = chunk.client[at]
            self.times[server_column][served[here]] = chunk.server[at]
        if self.recorded_out is not None:
            self.recorded_out.deliver(self.times, served)
        g = self.finish_step[served]
        self.records.done[served[(g >= 0) & (g < end)]] = True
        self.records.write_final()

    def finish(self) -> None:
        """After the run: deliver the rest, and write the rest of the step table."""
        self.deliver()
        self.steps.close()
        self.finished_run = True

    def detokenizer_queue(self) -> tuple[np.ndarray, np.ndarray]:
        """(time, messages waiting) of the detokenizer at each change (after the run)."""
        if not self.finished_run:
            raise RuntimeError("detokenizer_queue() before the run ended")
        return self.delivery.detokenizer.queue()
