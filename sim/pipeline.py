"""The SimPy model of the serving pipeline, driving the real scheduler core.

Stages of a request, each with its queue::

    arrival ─► frontend (queue) ─► IPC ─► tokenizer pool (queue) ─► IPC ─► scheduler (queue)
        ─► GPU steps ─► IPC ─► detokenizer (queue) ─► IPC ─► client

The scheduler process is ``sim.engine_loop.EngineLoop``: it adds the requests
that reached the scheduler and makes the core's calls in the engine's order,
strict or overlapped, fast-forwarding runs of identical decode steps.

Token times: a step's tokens leave the engine when its plan is completed,
travel to the detokenizer (an exact FIFO queue, see ``DetokenizerQueue``), and
reach the client one IPC hop later; that client time is what TTFT, ITL and E2E
use.
"""

from __future__ import annotations

import math
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
    SchedulerStats,
    TokenOut,
)
from sim.costs.base import CpuCosts, GpuCostModel, StepShape
from sim.detokenizer import DetokenizerQueue
from sim.engine_loop import EngineLoop
from sim.steplog import StepLog
from sim.traces.record import TraceRequest

NAN = math.nan
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
        self.frontend = simpy.Resource(self.env, capacity=1)  # one asyncio event loop
        self.tokenizers = simpy.Resource(self.env, capacity=num_tokenizers)
        n = len(requests)
        self.index = {r.rid: i for i, r in enumerate(requests)}
        self.times: dict[str, list[float]] = {f: [NAN] * n for f in TIME_FIELDS}
        self.status = ["pending"] * n
        self.reason = [""] * n
        self.output_tokens = [0] * n
        self.cached_tokens = [0] * n
        self.preemptions = [0] * n
        self.detokenize_s = [0.0] * n
        self.last_chunk = [NAN] * n
        self.reqs: list[Request | None] = [None] * n
        self.itl_single: list[float] = []
        self.itl_runs: list[tuple[np.ndarray, int]] = []
        self.steps = StepLog(scheduler.config.num_pages)
        self.detok = DetokenizerQueue(cpu.detokenize)
        self.queue_samples: list[tuple[float, str, int]] = []
        self._waiting_in = {"frontend": 0, "tokenizer": 0}
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
        engine = self.env.process(EngineLoop(self).run())
        self.env.run(until=engine)

    def _arrivals(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        for i, tr in enumerate(self.trace):
            if tr.arrival > env.now:
                yield env.timeout(tr.arrival - env.now)
            env.process(self._request(i, tr))

    def _request(self, i: int, tr: TraceRequest) -> Generator[simpy.Event, Any, None]:
        env, cpu, times = self.env, self.cpu, self.times
        times["arrival"][i] = env.now
        loop = self.frontend.request()
        yield from self._queue(loop, "frontend")
        yield env.timeout(cpu.frontend)
        self.frontend.release(loop)
        times["parsed"][i] = env.now
        yield env.timeout(cpu.ipc)
        times["tokenizer_enter"][i] = env.now
        slot = self.tokenizers.request()
        yield from self._queue(slot, "tokenizer")
        times["tokenize_start"][i] = env.now
        yield env.timeout(cpu.tokenize * tr.input_length)
        self.tokenizers.release(slot)
        times["tokenized"][i] = env.now
        yield env.timeout(cpu.ipc)
        times["sched_arrival"][i] = env.now
        self._not_arrived -= 1
        self._inbox.append(i)
        self.sample_scheduler_queue(env.now)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _queue(self, grant: simpy.Event, stage: str) -> Generator[simpy.Event, Any, None]:
        """Wait for ``grant``; a request that has to wait is counted in ``stage``'s queue."""
        if grant.triggered:
            yield grant
            return
        waiting = self._waiting_in
        waiting[stage] += 1
        self.queue_samples.append((self.env.now, stage, waiting[stage]))
        yield grant
        waiting[stage] -= 1
        self.queue_samples.append((self.env.now, stage, waiting[stage]))

    def wait_for_arrival(self) -> simpy.Event:
        self._wake = self.env.event()
        return self._wake

    # ------------------------------------------------------------------ for the engine loop
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
        """The events of ``plan``'s completion; its tokens leave the engine at ``end``."""
        ntokens = sum(1 for e in events if type(e) is TokenOut)
        client = detok = NAN
        if ntokens:
            arrive = end + self.cpu.ipc
            depart = self.detok.serve_one(arrive, ntokens)
            client = depart + self.cpu.ipc
            detok = depart - arrive
        times = self.times
        first_token, finished, last = times["first_token"], times["finished"], self.last_chunk
        for e in events:
            i = self.index[e.rid]
            kind = type(e)
            if kind is TokenOut:
                self.output_tokens[i] += 1
                self.detokenize_s[i] += detok
                if e.first:
                    first_token[i] = client
                else:
                    self.itl_single.append(client - last[i])
                last[i] = client
            elif kind is Finished:
                finished[i] = client if ntokens else end
                self.status[i] = "completed"
                self._end_request()
            elif kind is Preempted:
                self.preemptions[i] += 1

    def tokens_of_run(self, rids: tuple[str, ...], leave: np.ndarray) -> None:
        """One token per request in ``rids`` leaving the engine at each time of ``leave``."""
        batch = len(rids)
        arrive = leave + self.cpu.ipc
        depart = self.detok.serve_run(arrive, batch)
        client = depart + self.cpu.ipc
        detok_total = float(np.sum(depart - arrive))
        last, out, detok = self.last_chunk, self.output_tokens, self.detokenize_s
        first_client = float(client[0])
        j = len(leave)
        for rid in rids:
            i = self.index[rid]
            self.itl_single.append(first_client - last[i])
            last[i] = float(client[-1])
            out[i] += j
            detok[i] += detok_total
        if j > 1:
            self.itl_runs.append((np.diff(client), batch))

    def _end_request(self) -> None:
        self._done += 1
        self.progress.update(1)

    def sample_scheduler_queue(self, now: float) -> None:
        waiting = self.sched.num_waiting + len(self._inbox)
        if waiting != self._sched_waiting:
            self._sched_waiting = waiting
            self.queue_samples.append((now, "scheduler", waiting))

    # ------------------------------------------------------------------ results
    def itl(self) -> np.ndarray:
        parts = [np.asarray(self.itl_single, dtype=np.float64)]
        parts += [np.tile(gaps, batch) for gaps, batch in self.itl_runs]
        return np.concatenate(parts)
