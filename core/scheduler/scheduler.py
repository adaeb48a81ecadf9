"""The scheduler core shared by the real engine and the simulator.

Contract: ``add`` and ``abort`` requests, ``schedule(now) -> Plan``, then
``complete(plan, tokens) -> events``. Plain Python on ints and lists: no torch,
no zmq, no clock. The same sequence of calls gives the same plans, so
tensor-parallel ranks and the simulator agree.

Overlap scheduling: ``schedule`` may be called while one plan is in flight
(made, not completed); plans complete in the order they were made. Requests
advance when a plan places them, so the next plan continues where the one in
flight ends: a decoding request's next slot is its next position, whose input
token the in-flight plan samples (see ``core.scheduler.plan``). A request
that finishes when the in-flight plan completes may have been placed in the
next plan too; that slot's token is discarded. Pages given up while a plan in
flight uses them return when that plan completes (``core.scheduler.inflight``).
Strict alternation (complete each plan before the next ``schedule``) is the
same code with nothing in flight.

Speculative decoding (``num_draft_tokens`` > 0 and a ``Drafter``): each
decoding request placed gets a slot with up to that many draft tokens, as
the output limit and spare pages allow (``core.scheduler.speculative``); when
its input token is still being sampled by the plan in flight, the drafter is
asked for one more token and its first guess (for that token) is dropped. At
``complete`` the verified tokens are delivered and the request rolls back to
them. With overlap, a request whose slot in flight carries drafts sits the
next step out: its next position depends on how many are accepted. Placed so,
the running requests could split into groups that verify in turn, each
request placed at most every other step; the loops (the engine's and the
simulator's) therefore complete a step with drafts before they schedule the
next. Requests without drafts are scheduled exactly as without speculation.

One step, in order:

1. release aborted requests (their pages go back, or into the prefix cache);
2. give every decoding request room for one more token, evicting unreferenced
   cache pages; when that is not enough and pages held for the plan in flight
   will cover it, the request sits this step out, else the policy's victim is
   preempted (recompute: its pages are released and it waits again);
   with speculation, then give the placed requests their drafts, from pages
   that are free or evictable;
3. continue chunked prefills, then admit waiting requests in policy order while
   the running cap, the prefill token budget and KV pages (minus the decode
   reservation, when enabled) allow; admission stops at the first request that
   does not fit (no request overtakes the head).

A request is admitted with pages for its whole fill (prompt + output so far),
so later chunks never allocate; only decode grows a request (and a rollback
after a draft shrinks it).

Prefill/decode roles (``core.scheduler.handoff``): a prefill-role scheduler
plans one output token per request and holds its pages for their transfer; a
decode-role one admits requests whose KV arrives (``add_incoming``) into
pages that no plan uses until the caller reports them landed.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from core.scheduler import decode_run
from core.scheduler.config import SchedulerConfig, SchedulerStats
from core.scheduler.drafter import Drafter
from core.scheduler.handoff import Handoff
from core.scheduler.inflight import InFlight
from core.scheduler.memory import KVMemory
from core.scheduler.plan import (
    Blocked,
    DecodeRun,
    DecodeSlot,
    Plan,
    PrefillChunk,
)
from core.scheduler.policy import Key, get_policy
from core.scheduler.request import Request, RequestRejected, RequestStatus, check_servable
from core.scheduler.reservation import DecodeReservation
from core.scheduler.speculative import give_drafts


class Scheduler(Handoff):
    def __init__(self, config: SchedulerConfig, drafter: Drafter | None = None) -> None:
        self.config = config
        self.drafter = drafter
        self.policy = get_policy(config.policy)
        self.page_size = config.page_size
        self.memory = KVMemory(config)
        self.reservation = DecodeReservation(config)
        self.in_flight = InFlight()
        self.requests: dict[str, Request] = {}  # live requests (not yet ended)
        self._waiting: list[tuple[Key, Request]] = []  # sorted by the policy's key
        self.running: dict[str, Request] = {}  # admission order
        self._aborted: list[Request] = []  # marked, released at the next step
        self.step = 0
        self._seq = 0
        self._changes = 0  # calls that changed the state (add, abort, schedule, ...)
        self._run_checked = (-1, 0)  # (_changes, k) of the last decode_run_length
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._limits = {}  # the roles' state (core.scheduler.handoff)
        self._transfers = {}
        self._receiving = []

    # ------------------------------------------------------------------ requests
    def add(self, req: Request) -> None:
        """Queue a request. Raises ``RequestRejected`` if it can never be served (or, in the
        decode role, comes without its KV: ``add_incoming``)."""
        if req.rid in self.requests or req.rid in self._transfers:
            raise RequestRejected(f"duplicate request id {req.rid!r}")
        check_servable(req, self.config)
        role = self.config.role
        if role == "decode":
            raise RequestRejected(f"request {req.rid}: a decode scheduler takes it with its KV")
        if role == "prefill" and req.max_new_tokens > 1:
            self._limits[req.rid] = req.max_new_tokens  # the decode instance's to generate
            req.max_new_tokens = 1
        self._queue(req, RequestStatus.WAITING)

    def _queue(self, req: Request, status: RequestStatus) -> None:
        self._changes += 1
        req.status = status
        req.seq = self._seq
        self._seq += 1
        self.requests[req.rid] = req
        self._enqueue(req)

    def abort(self, rid: str) -> bool:
        """Mark a live request aborted; its pages are released at the next step. A request
        handed off (prefill role) whose transfer failed: its pages are released now."""
        req = self.requests.get(rid)
        if req is None:
            return self._end_transfer(rid)
        if req.status is RequestStatus.ABORTED:
            return False
        self._changes += 1
        req.status = RequestStatus.ABORTED
        self._aborted.append(req)
        return True

    def get(self, rid: str) -> Request | None:
        return self.requests.get(rid)

    def has_work(self) -> bool:
        """Whether ``schedule``/``complete`` have anything left to do (plans in flight count)."""
        return bool(self.running or self._waiting or self._aborted or len(self.in_flight))

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def aborts_pending(self) -> bool:
        """Whether aborted requests wait for the next step to release their pages."""
        return bool(self._aborted)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def waiting(self) -> list[Request]:
        """Waiting requests in the policy's static order."""
        return [r for _, r in self._waiting]

    def stats(self) -> SchedulerStats:
        memory, pages = self.memory, self.config.pages
        free = memory.num_free
        counts = (  # SchedulerStats' fields in order, positional (the simulator asks every step)
            pages,
            pages - free,
            free,
            memory.evictable,
            len(self._waiting),
            len(self.running),
            self.prompt_tokens,
            self.cached_tokens,
        )
        return SchedulerStats(*counts, **memory.host_stats())

    # ------------------------------------------------------------------ schedule
    def schedule(self, now: float) -> Plan:
        """Plan the next step at time ``now`` (stamped on newly admitted requests).

        Raises ``PlanOrderError`` when two plans are outstanding already.
        """
        self.in_flight.check_can_schedule()
        self._changes += 1
        self.step += 1
        aborted = self._release_aborted()
        if not self.running:
            self.reservation.reset()
        preempted: list[str] = []
        placed = self._grow_decodes(preempted)
        drafts = None
        if self.speculative:
            assert self.drafter is not None
            drafts = give_drafts(placed, self.drafter, self.memory, self.config.num_draft_tokens)

        budget = self.config.max_prefill_tokens
        chunks: list[PrefillChunk] = []
        for req in self.running.values():
            if req.status is RequestStatus.PREFILLING and budget > 0:
                budget -= self._chunk(req, budget, chunks)
        blocked = self._admit(budget, chunks, now)

        decode = []
        step = self.step
        if drafts is None:
            for req in placed:
                decode.append(DecodeSlot(req.rid, req.num_planned, req.pages))
                req.num_planned += 1
                req.last_plan = step
        else:
            for req, draft in zip(placed, drafts, strict=True):
                decode.append(DecodeSlot(req.rid, req.num_planned, req.pages, draft))
                req.num_planned += 1 + len(draft)
                req.draft_in_flight = len(draft)
                req.last_plan = step
        if decode:
            self.reservation.decayed()
        writes, loads = self.memory.take_copies()
        plan = Plan(
            step=self.step,
            prefill=tuple(chunks),
            decode=tuple(decode),
            preempted=tuple(preempted),
            aborted=tuple(aborted),
            blocked=blocked,
            writes=writes,
            loads=loads,
        )
        self.in_flight.add(plan, aborted)
        return plan

    def _grow_decodes(self, preempted: list[str]) -> list[Request]:
        """Give every decoding request a page for its next position; the requests to place.

        A request whose last token is already planned (it finishes when the plan
        in flight completes) is not placed again, nor one whose slot in flight
        carries draft tokens (its next position is not known yet).
        """
        placed: list[Request] = []
        running, ps = self.running, self.page_size
        decoding = RequestStatus.DECODING
        for req in [r for r in running.values() if r.status is decoding]:
            if preempted and running.get(req.rid) is not req:
                continue  # preempted earlier in this loop
            if req.draft_in_flight:
                continue
            num_planned = req.num_planned
            if num_planned - req.prompt_len + 1 >= req.max_new_tokens:  # planned_outputs, inlined
                continue
            if num_planned >= len(req.pages) * ps:  # the next position starts a page
                if not self._free_a_page(req, preempted):
                    continue
                self.memory.add_pages(req)
            placed.append(req)
        if not preempted:
            return placed
        gone = set(preempted)
        return [r for r in placed if r.rid not in gone]

    def _free_a_page(self, requester: Request, preempted: list[str]) -> bool:
        """Make a page free for ``requester``'s next position; False if it sits this step out.

        Evicts first. Pages that come back when the plan in flight completes
        (held pages, and those of requests finishing with it) are waited for
        rather than preempting anyone. Otherwise the policy's victim among the
        requests not finishing is preempted (possibly ``requester`` itself).
        """
        memory = self.memory
        while memory.num_free < 1:
            if memory.make_room(1):
                continue
            finishing = {  # those whose plan in flight surely ends them (drafts may be rejected)
                r.rid: r
                for r in self.running.values()
                if r.status is RequestStatus.DECODING
                and r.planned_outputs - r.draft_in_flight >= r.max_new_tokens
            }
            soon = self.in_flight.pending_pages()
            soon += sum(len(r.pages) - r.num_shared_pages for r in finishing.values())
            if soon > 0:
                return False
            victim = self.policy.victim(  # a request whose KV is in transfer is not a victim
                [
                    r
                    for r in self.running.values()
                    if r.rid not in finishing and r.status is not RequestStatus.RECEIVING
                ]
            )
            self._preempt(victim)
            preempted.append(victim.rid)
            if victim is requester:
                return False
        return True

    def _admit(self, budget: int, chunks: list[PrefillChunk], now: float) -> Blocked:
        if not self._waiting:
            return Blocked.NONE
        cap = self.config.max_running
        ps = self.page_size
        reserved = self.reservation.tokens(self.running.values())
        admitted: list[Request] = []
        blocked = Blocked.NONE
        for req in self.admission_order():
            if len(self.running) >= cap:
                blocked = Blocked.RUNNING_CAP
                break
            if budget <= 0:
                blocked = Blocked.PREFILL_BUDGET
                break
            need, available = self.memory.fill_need(req)
            growth = self.reservation.tokens((req,))
            if need > available or (
                self.running and need * ps + reserved + growth > available * ps
            ):  # the reservation protects running requests; alone, a request always fits
                blocked = Blocked.KV_MEMORY
                break
            reserved += growth
            self._start(req, need, now)
            admitted.append(req)
            if req.status is RequestStatus.PREFILLING:
                budget -= self._chunk(req, budget, chunks)
        if admitted and not self.policy.reorders:
            del self._waiting[: len(admitted)]  # admission took a prefix of the queue
        elif admitted:
            gone = {r.rid for r in admitted}
            self._waiting = [e for e in self._waiting if e[1].rid not in gone]
        return blocked

    def admission_order(self) -> Sequence[Request]:
        """Waiting requests in the order admission tries them (enough to hit the cap)."""
        if self.policy.reorders:
            return self.policy.order(self.waiting(), self.memory.cached_pages_of)
        room = self.config.max_running - len(self.running)
        return [r for _, r in self._waiting[: max(room, 0) + 1]]

    def _start(self, req: Request, need: int, now: float) -> None:
        """Admit ``req``: its cached prefix plus ``need`` fresh pages for the rest of its fill
        (decode role: an incoming request's pages wait for its KV)."""
        self.memory.allocate_fill(req, need, self.step)
        if req.status is RequestStatus.INCOMING:
            req.status = RequestStatus.RECEIVING
            self._receiving.append(req)
        else:
            req.status = RequestStatus.PREFILLING
        req.admitted_at = self.step
        if req.first_scheduled is None:
            req.first_scheduled = now
        self.running[req.rid] = req
        self.prompt_tokens += req.fill_len
        self.cached_tokens += req.num_cached

    def _chunk(self, req: Request, budget: int, chunks: list[PrefillChunk]) -> int:
        """Place ``req``'s next fill chunk (the last one makes it decoding); its length."""
        start = req.num_planned
        length = min(req.fill_len - start, budget)
        samples = start + length == req.fill_len
        chunks.append(PrefillChunk(req.rid, start, length, samples, req.pages))
        req.num_planned += length
        req.last_plan = self.step
        if samples:
            req.status = RequestStatus.DECODING
        return length

    def _preempt(self, req: Request) -> None:
        del self.running[req.rid]
        self._release(req)
        req.status = RequestStatus.WAITING
        self._enqueue(req)
        self.reservation.reset()

    def _enqueue(self, req: Request) -> None:
        bisect.insort(self._waiting, ((*self.policy.key(req), req.seq), req))

    # ------------------------------------------------------------------ decode runs
    def decode_run_length(self, max_steps: int) -> int:
        """How many following steps are identical pure-decode steps (0 if none).

        See ``core.scheduler.decode_run`` for the conditions; stop tokens are
        not foreseen, so this is for callers that pass no tokens (simulation).
        """
        k = decode_run.run_length(self, max_steps)
        self._run_checked = (self._changes, k)
        return k

    def advance_decode(self, k: int) -> DecodeRun:
        """Apply ``k`` pure-decode steps at once, exactly as ``k`` single steps would.

        ``k`` must not exceed ``decode_run_length(k)``. Without a plan in flight
        a step is ``schedule`` + ``complete(plan, None)``; with one (overlap), it
        is ``schedule`` + ``complete`` of the plan before, and the run's last
        plan is left in flight (``DecodeRun.in_flight``).
        """
        changes, length = self._run_checked  # still valid if nothing changed since
        if changes != self._changes:
            length = decode_run.run_length(self, k)
        if k <= 0 or k > length:
            raise ValueError(f"cannot advance {k} decode steps from this state")
        self._changes += 1
        return decode_run.advance(self, k)
