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

Token times: a step's tokens leave the GPU at the step's end, travel to the
detokenizer (an exact FIFO queue, see ``DetokenizerQueue``), go one IPC hop to
the frontend and through its SSE streaming (another FIFO queue, ``stream`` cost
per token); that client time is what TTFT, ITL and E2E use.
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
    TokenOut,
)
from sim.costs.base import CpuCosts, GpuCostModel, StepShape
from sim.detokenizer import DetokenizerQueue
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
        self.stream_out = DetokenizerQueue(cpu.stream)  # the frontend's SSE event per token
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
        engine = self.env.process(self._engine())
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
        self._sample_scheduler_queue(env.now)
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
        ntokens = sum(1 for e in events if type(e) is TokenOut)
        client = detok = NAN
        if ntokens:
            arrive = end + self.cpu.ipc
            depart = self.detok.serve_one(arrive, ntokens)
            client = self.stream_out.serve_one(depart + self.cpu.ipc, ntokens)
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
        longest = max(r.num_computed for r in running)
        gpu = self.gpu.decode_times(batch, context + batch, longest + 1, k)
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
        ends = starts + durations
        arrive = ends + self.cpu.ipc
        depart = self.detok.serve_run(arrive, batch)
        client = self.stream_out.serve_run(depart + self.cpu.ipc, batch)
        detok_total = float(np.sum(depart - arrive))
        last, out, detok = self.last_chunk, self.output_tokens, self.detokenize_s
        first_client = float(client[0])
        for rid in run.rids:
            i = self.index[rid]
            self.itl_single.append(first_client - last[i])
            last[i] = float(client[-1])
            out[i] += j
            detok[i] += detok_total
        if j > 1:
            self.itl_runs.append((np.diff(client), batch))
        steps = np.arange(run.first_step, run.first_step + j)
        context = run.context_tokens + batch * np.arange(1, j + 1)
        pages = stats.pages_held + np.cumsum(np.asarray(run.new_pages, dtype=np.int64))
        self.steps.add_run(
            {
                "step": steps,
                "time": starts,
                "duration_s": durations,
                "batch_size": batch,
                "prefill_tokens": 0,
                "decode_requests": batch,
                "context_tokens": context,
                "kv_pages_used": pages,
                "num_waiting": stats.num_waiting,
                "num_running": stats.num_running,
                "preempted": 0,
                "blocked": run.blocked,
                "cached_tokens": stats.cached_tokens,
                "prompt_tokens": stats.prompt_tokens,
            }
        )

    # ------------------------------------------------------------------ results
    def itl(self) -> np.ndarray:
        parts = [np.asarray(self.itl_single, dtype=np.float64)]
        parts += [np.tile(gaps, batch) for gaps, batch in self.itl_runs]
        return np.concatenate(parts)
