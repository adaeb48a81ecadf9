"""The simulated twin of the engine's ``SchedulerLoop``: the core's calls, priced by cost models.

Strict alternation (the default): each iteration calls ``schedule(now)``,
spends the scheduler's CPU time, runs the step on the GPU, then ``complete``;
the step's tokens leave when it ends. A step costs CPU + GPU.

Overlap scheduling (``overlap``) makes the engine's calls in the engine's
order, with at most one plan in flight when ``schedule`` is called::

    iteration i:   plan_i = schedule(now)          CPU: the scheduler's time of a step
                                                   (the profile's schedule + complete),
                                                   and the step's host work (its wall
                                                   time less its device time)
                   launch plan_i                   GPU: starts when the CPU launched it and
                                                        plan_{i-1} has ended; lasts the
                                                        step's device time
                   complete(plan_{i-1})            waits for plan_{i-1}'s GPU end; its tokens
                                                   leave then
                   (an empty plan_i is completed at once)

so the GPU runs step N+1 right after step N when the CPU formed it in time, a
finish is seen one step late, and pages freed meanwhile come back a step later.
Where the profile measured how long a launch holds the host (``launch_time``;
on CPU the forward pass runs inside it, on a GPU an eagerly run step's kernel
launches may outlast its compute), the host is held that long (at least the wall
time less the device time), the step ends no sooner than its launch returns, and
only then does the host complete ``plan_{i-1}`` and form the next step.

Host KV tier copies (``LoopSettings.copies``): a plan's writes, then its loads,
run before its compute. Strict, they add to the step's time. Overlapped, as the
engine runs them on a side stream from the launch on, they overlap the step in
flight: the step's compute starts once its copies end and the GPU is free. The
host does not wait for them: it completes the step in flight as soon as that
ends. Decode runs carry no copies (the core keeps them out of runs).

Layouts (``LoopSettings.layout``): in ``inline`` the loop also does the text
work, where the engine's does. As it takes in the requests that reached it, it
tokenizes each (``tokenize`` per prompt token, one after another) before it
schedules: a long prompt delays the next launch for every running request, and
with overlap the GPU idles once the step in flight ends. After completing a
step it detokenizes that step's tokens (``detokenize`` per token) before it goes
on; they leave then. In ``split`` and ``frontend`` other processes do both.

Speculative decoding (``LoopSettings.acceptance``): the core, built with the
placeholder drafter, gives decode slots drafts; the loop prices such a step by
its shape (a slot with a draft is an extend of its token and draft, as the
engine lays it out), draws how many drafts each slot accepts when it prices
it (``sim.costs.acceptance``), and passes them to ``complete``; a drafter that
runs a model adds its drafts' time to the step's scheduling (``sim.model.drafter``).
The core keeps speculating steps out of decode runs. With overlap, a step that
verifies drafts completes before the next is formed, as the engine's does.

Fast-forward: when the core says the next k steps are identical pure-decode
steps (with overlap: and a pure decode is in flight), the loop prices all k
with numpy and waits for the run's end or for a request reaching the
scheduler, whichever comes first; interrupted at t, it applies the iterations
that began before t and carries on. Decisions and times equal those of
stepping one by one. A host that cannot know its arrivals ahead (a replica
behind the simulated router) makes the loop ``interruptible``: the loop then
waits for the run before advancing the core, and ``cut_run`` (a request
reached the scheduler) ends the wait after the step running then.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from core.scheduler import DecodeRun, Plan, SchedulerStats, TokenOut
from core.scheduler.shape import StepShape
from sim.costs.acceptance import AcceptanceDraws
from sim.costs.base import CpuCosts, GpuCostModel
from sim.costs.colocation import kind_of
from sim.costs.reach import Reach
from sim.model.loop_settings import LoopHost, LoopSettings
from sim.model.run_times import overlapped_run, strict_run
from sim.model.shared_gpu import Piece, Seat, debt_first
from sim.model.step_record import StepRecordLog, drafts_of

Process = Generator[simpy.Event, Any, None]
Stepping = Generator[simpy.Event, Any, "Launched | None"]  # returns the plan left in flight


@dataclass(frozen=True, slots=True)
class Launched:
    """A plan on the simulated GPU, when its GPU work ends, and the draft tokens each of its
    slots with a draft will have accepted (None: it verifies none)."""

    plan: Plan
    end: float
    accepted: dict[str, int] | None = None


class SimSchedulerLoop:
    """Drives ``sched`` like the engine's ``SchedulerLoop``, strict or overlapped."""

    def __init__(
        self,
        env: simpy.Environment,
        sched: Any,
        gpu: GpuCostModel,
        cpu: CpuCosts,
        host: LoopHost,
        settings: LoopSettings,
    ) -> None:
        self.env = env
        self.sched = sched
        self.gpu = gpu
        self.cpu = cpu
        self.p = host
        self.settings = settings
        self.detokenize = cpu.detokenize if settings.layout == "inline" else 0.0  # per token
        self.num_runs = 0
        self.steps_in_runs = 0
        self.interruptible = False
        self.seat: Seat | None = None  # this replica's place on a GPU shared with others
        self._in_run = False  # waiting out a decode run that cut_run may cut
        acceptance = settings.acceptance
        self.draws = None if acceptance is None else AcceptanceDraws(acceptance, settings.seed)
        speculative, transfers = acceptance is not None, host.transfers_kv
        self.record = StepRecordLog(speculative, transfers) if settings.record_steps else None
        self.reach = Reach()  # the largest steps priced (``sim.costs.reach``)
        self._counts = (0, 0)  # waiting and running before the last schedule (when recorded)

    def run(self) -> Process:
        p, env, s = self.p, self.env, self.sched
        prev: Launched | None = None  # the plan in flight (overlap only)
        while True:
            taking_in = p.admit_inbox()
            if taking_in > 0:  # inline: the loop tokenizes what it took in
                yield env.timeout(taking_in)
            if not s.has_work():
                if self.seat is not None:
                    self.seat.rest(env.now)
                if p.nothing_to_come():
                    return
                yield p.wait_for_arrival()
                continue
            if self.settings.fast_forward and (prev is not None or not self.settings.overlap):
                k = s.decode_run_length(self.settings.max_run_steps)
                if k >= 2:
                    prev = yield from self._decode_run(k, prev)
                    continue
            if self.record is not None:
                self._counts = (s.num_waiting, s.num_running)
            plan = s.schedule(env.now)
            p.sample_scheduler_queue(env.now)
            p.note_scheduled(plan)
            if self.settings.overlap:
                prev = yield from self._overlapped(plan, prev)
            else:
                yield from self._strict(plan)

    def _stalled(self) -> Process:
        """Nothing could run and nothing is in flight: wait for a request, or fail."""
        p, s = self.p, self.sched
        if not s.has_work():
            return
        if p.nothing_to_come():
            raise RuntimeError(
                f"the scheduler makes no progress at t={self.env.now:.6f}: "
                f"{s.num_waiting} waiting, {s.num_running} running, nothing arriving"
            )
        yield p.wait_for_arrival()

    # ------------------------------------------------------------------ single steps
    def _strict(self, plan: Plan) -> Process:
        p, env, s = self.p, self.env, self.sched
        copies = self.settings.copy_time(plan, s.page_size)
        if not plan.has_model_work:
            if copies:
                yield env.timeout(copies)
            p.handle_events(plan, s.complete(plan, None), env.now)
            yield from self._stalled()
            return
        start = env.now
        shape = StepShape.of_plan(plan)
        accepted = self._accepted(plan)
        schedule = self.cpu.schedule_time(plan.batch_size) + self._drafting()
        if self.seat is None:  # the step's time alone (its device part priced only if shared)
            duration = copies + self.gpu.step_time(shape) + schedule
        else:  # the device part stretched by the replicas beside it
            wall, device = self.gpu.times(shape)
            kind, on_gpu = kind_of(shape.prefill_tokens), start + schedule + copies
            duration = copies + wall + schedule
            duration += self.seat.price(kind, on_gpu, device) - device
        if self.record is not None:  # no device time: the strict loop prices none
            launched = start + schedule
            times = (start, launched, launched, start + duration)
            self.record.add(
                plan.step, times, math.nan, False, self._counts, len(plan.prefill), shape,
                drafts_of(plan, accepted),
            )  # fmt: skip
        stats = s.stats()
        yield env.timeout(duration)
        events = self._complete(plan, accepted)
        detok = self._detokenize_time(events)
        if detok:
            yield env.timeout(detok)
        p.record_step(plan, shape, start, duration + detok, stats)
        self.reach.widen(shape)
        p.handle_events(plan, events, env.now)

    def _overlapped(self, plan: Plan, prev: Launched | None) -> Stepping:
        """Launch ``plan`` once the CPU formed it, then complete ``prev`` when its GPU work
        ends; ``plan``'s compute starts once the GPU is free and its copies are done."""
        p, env, s = self.p, self.env, self.sched
        stats = s.stats()
        schedule = cpu = self.cpu.schedule_time(plan.batch_size) + self._drafting()
        shape = StepShape.of_plan(plan) if plan.has_model_work else None
        gpu = hold = 0.0
        if shape is not None:
            wall, gpu = self.gpu.times(shape)
            lead = max(wall - gpu, 0.0)
            cpu += lead
            hold = max(lead, self.gpu.launch_time(shape) or 0.0)
        now = env.now
        launch = now + cpu  # the GPU may start the step's compute
        returned = now + schedule + hold  # the host is held in the launch until then
        copied = launch + self.settings.copy_time(plan, s.page_size)  # on the side stream
        start = copied if prev is None else max(copied, prev.end)  # the GPU starts the compute
        free = returned if prev is None else max(returned, prev.end)  # the host may complete prev
        launched = None
        if shape is not None and self.seat is not None:  # stretched by the replicas beside it
            gpu = self.seat.price(kind_of(shape.prefill_tokens), start, gpu)
        duration = max(gpu, returned - start)  # a step ends no sooner than its launch returns
        end = start + duration
        if shape is not None:
            p.record_step(plan, shape, start, duration, stats)
            self.reach.widen(shape)
            launched = Launched(plan, end, self._accepted(plan))
            if self.record is not None:
                times = (now, now + schedule, returned, end)
                in_flight = prev is not None and returned < prev.end
                self.record.add(
                    plan.step, times, gpu, in_flight, self._counts, len(plan.prefill), shape,
                    drafts_of(plan, launched.accepted),
                )  # fmt: skip
        if free > env.now:
            yield env.timeout(free - env.now)
        if prev is not None:
            events = self._complete(prev.plan, prev.accepted)
            detok = self._detokenize_time(events)
            if detok:
                yield env.timeout(detok)
            p.handle_events(prev.plan, events, env.now)
        if launched is None:
            if start > env.now:  # a plan of copies only: done when they are
                yield env.timeout(start - env.now)
            p.handle_events(plan, s.complete(plan, None), env.now)
            if prev is None:
                yield from self._stalled()
        elif plan.num_draft_tokens:  # a verify step completes before the next is formed
            if launched.end > env.now:
                yield env.timeout(launched.end - env.now)
            events = self._complete(plan, launched.accepted)
            detok = self._detokenize_time(events)
            if detok:
                yield env.timeout(detok)
            p.handle_events(plan, events, env.now)
            return None
        return launched

    def _drafting(self) -> float:
        """What drafting cost in the last ``schedule`` call (a drafter that runs a model)."""
        drafter = self.settings.drafter
        return 0.0 if drafter is None else drafter.take_spent()

    def _accepted(self, plan: Plan) -> dict[str, int] | None:
        """The draft tokens each of ``plan``'s slots with a draft accepts (speculative decoding;
        drawn as the step is priced, applied when it completes)."""
        return None if self.draws is None else self.draws.draw(plan)

    def _complete(self, plan: Plan, accepted: dict[str, int] | None) -> list[Any]:
        """``complete`` the step (no tokens: simulation), with its drafts' accepted counts."""
        if accepted is None:
            return self.sched.complete(plan, None)  # type: ignore[no-any-return]
        return self.sched.complete(plan, None, accepted=accepted)  # type: ignore[no-any-return]

    def _detokenize_time(self, events: list[Any]) -> float:
        """Inline: how long the loop takes to turn a completed step's tokens into text, before
        they leave (0 in the other layouts)."""
        if not self.detokenize:
            return 0.0
        return sum(type(e) is TokenOut for e in events) * self.detokenize

    # ------------------------------------------------------------------ decode runs
    def _decode_run(self, k: int, prev: Launched | None) -> Stepping:
        """Up to ``k`` identical decode iterations at once; the plan left in flight, if any."""
        p, env, s = self.p, self.env, self.sched
        now = env.now
        rids = tuple(s.running)
        planned = [r.num_planned for r in s.running.values()]
        batch = len(planned)
        context = sum(planned)
        longest = max(planned)
        wall = self.gpu.decode_times(batch, context + batch, longest + 1, k)
        schedule = self.cpu.schedule_time(batch)
        detok = batch * self.detokenize  # the loop's text work on a step's tokens (inline)
        device: np.ndarray | None  # the steps' device times, where the loop priced them
        seat = self.seat
        if seat is not None or prev is not None:  # the steps' device times alone
            alone = self.gpu.decode_device_times(batch, context + batch, longest + 1, k)
        if seat is not None:  # on a shared GPU: stretched, and the first step pays the debt
            at = now if prev is None else prev.end
            stretch, until, beside = seat.stretch("decode", at, float(alone[0]))
            debt = 0.0  # of the run's first step, run first (Seat.pay)
        if prev is None:  # strict: step j runs [start, start + cpu + gpu]; tokens at its end
            if seat is not None:
                wall = wall + alone * (stretch - 1.0)
                paid, debt = seat.pay(alone[0] * stretch)
                wall[0] += paid - alone[0] * stretch
            gpu = wall
            run_times = strict_run(now, gpu, schedule, detok)
            device = None
        else:  # overlap: the step's host work before the device may start it, and the launch
            gpu = alone
            lead = np.maximum(wall - gpu, 0.0)
            if seat is not None:
                gpu = gpu * stretch
                gpu[0], debt = seat.pay(gpu[0])
            held = self.gpu.decode_launch_times(batch, context + batch, longest + 1, k)
            hold = None if held is None else schedule + np.maximum(held, lead)
            run_times = overlapped_run(now, prev.end, schedule + lead, gpu, detok, hold)
            device = gpu
        begins, starts, step_ends, ends, returned, durations = run_times
        token_times = ends
        # a request reaching the scheduler before the run's end cuts it after the step
        # running then (the clock's end of the whole run: now + (ends[-1] - now))
        j = k
        arrival = p.next_arrival()
        if arrival is not None and arrival < now + (float(ends[-1]) - now):
            j = max(1, int(begins.searchsorted(arrival, side="left")))
        if seat is not None:  # the run holds while what it runs beside does
            j = min(j, max(1, int(starts.searchsorted(until, side="left"))))
            run_ends = starts[:j] + gpu[:j]
            pieces = (*debt_first(float(starts[0]), debt), Piece(math.inf, beside))
            work = float(alone[0])
            seat.occupy("decode", work, float(starts[0]), float(run_ends[-1]), pieces, run_ends)
        streamed = p.stream_tokens(token_times[:j], batch)  # to a frontend that streams them
        stats = s.stats()
        waited = False
        if self.interruptible:
            j = yield from self._wait_run(begins, ends, j)
            waited = True
            if streamed is not None:
                streamed.cut(j)
            if seat is not None:
                seat.trim(float(starts[j - 1] + gpu[j - 1]))
        run = s.advance_decode(j)
        if run.context_tokens != context or run.rids != rids:
            raise RuntimeError("decode run differs from the running set the sim priced")
        self.num_runs += 1
        end = float(ends[j - 1])
        if not waited and now < end:
            yield env.timeout(end - now)
        self._record_run(run, starts[:j], durations[:j], token_times[:j], stats)
        self.reach.widen_run(batch, longest + j)  # the run's last step reads longest + j
        if self.record is not None:
            times = (begins[:j], begins[:j] + schedule, returned[:j], step_ends[:j])
            first = (batch, context + batch, longest + 1)
            device = np.full(j, np.nan) if device is None else device[:j]
            counts = (stats.num_waiting, stats.num_running)
            prev_end = None if prev is None else prev.end
            self.record.add_run(run.first_step, times, device, prev_end, counts, first)
        if run.in_flight is None:
            return None
        return Launched(run.in_flight, float(step_ends[j - 1]))

    def _wait_run(self, begins: np.ndarray, ends: np.ndarray, j: int) -> Generator[Any, Any, int]:
        """Wait for the end of the run's ``j``-th iteration; cut (``cut_run``) at t, wait for
        the end of the iteration running at t instead. Returns the iterations to apply."""
        env = self.env
        now = env.now
        if now < ends[j - 1]:
            self._in_run = True
            try:
                yield env.timeout(float(ends[j - 1]) - now)
            except simpy.Interrupt:
                t = env.now
                j = min(j, max(1, int(np.searchsorted(begins, t, side="left"))))
                if t < ends[j - 1]:
                    yield env.timeout(float(ends[j - 1]) - t)
            self._in_run = False
        return j

    def cut_run(self, process: simpy.Process) -> None:
        """A request reached the scheduler: end the decode run ``process`` is waiting out
        (after the iteration running now), if it is waiting one out."""
        if self._in_run:
            self._in_run = False
            process.interrupt()

    def _record_run(
        self,
        run: DecodeRun,
        starts: np.ndarray,
        durations: np.ndarray,
        token_times: np.ndarray,
        stats: SchedulerStats,
    ) -> None:
        """Step rows of the run's steps, and the tokens of the ``run.k`` plans it completed."""
        self.steps_in_runs += run.k
        self.p.tokens_of_run(run.rids, token_times)
        self.p.record_run(run, starts, durations, stats)
