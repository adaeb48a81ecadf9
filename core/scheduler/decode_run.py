"""Runs of identical pure-decode steps, advanced at once (the simulator's fast path).

Between arrivals, finishes, chunk ends and page-boundary allocations,
consecutive decode steps are identical but for each context growing by one
token. A run of ``k`` such steps holds while nothing is added or aborted and:

- there is no speculation (steps with draft tokens differ by what is accepted);
- every running request is decoding, and none can finish by length within
  the run (stop tokens are not foreseen: callers pass no tokens);
- nothing waiting can be admitted: the queue is empty, the running cap binds,
  or the head's pages (plus the decode reservation at the run's last step,
  the smallest it gets) exceed what is available at its start;
- the pages the run allocates are free or evictable (free only with a host
  tier: a run carries no copies, so it neither evicts nor follows queued ones);
- with a plan in flight (overlap): that plan is a pure decode of exactly the
  running requests, with no aborts, preemptions or held pages.

``advance`` then applies the run: the same pages in the same order, the same
tokens, step counter and new-token ratio as ``k`` single steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from core.scheduler.config import SchedulerConfig
from core.scheduler.inflight import InFlight
from core.scheduler.memory import KVMemory
from core.scheduler.pages import pages_for
from core.scheduler.plan import PLACEHOLDER_TOKEN, Blocked, DecodeRun, DecodeSlot, Plan
from core.scheduler.policy import Policy
from core.scheduler.request import Request, RequestStatus
from core.scheduler.reservation import DecodeReservation


class SchedulerState(Protocol):
    """What a decode run reads and advances of the scheduler (``Scheduler`` is one)."""

    config: SchedulerConfig
    policy: Policy
    page_size: int
    memory: KVMemory
    reservation: DecodeReservation
    in_flight: InFlight
    running: dict[str, Request]
    step: int

    @property
    def speculative(self) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def aborts_pending(self) -> bool: ...

    def admission_order(self) -> Sequence[Request]: ...


def run_length(s: SchedulerState, max_steps: int) -> int:
    """How many following steps are identical pure-decode steps (0 if none)."""
    if s.aborts_pending or not s.running or max_steps <= 0 or len(s.in_flight) > 1:
        return 0
    if s.speculative:
        return 0
    plan = s.in_flight.oldest()
    if plan is not None and not _continues(s, plan):
        return 0
    k = max_steps
    decoding = RequestStatus.DECODING
    for req in s.running.values():
        if req.status is not decoding:
            return 0
        last = req.max_new_tokens - len(req.output) - 1  # the run must not finish it
        if last < k:
            k = last
    if k <= 0:
        return 0
    evictions_allowed = True
    if s.num_waiting and len(s.running) < s.config.max_running:
        k = _head_stays_out(s, k)
        if k <= 0:
            return 0
        # under a reordering policy the order may change with the cache, so the run must not evict
        evictions_allowed = not s.policy.reorders
    if s.memory.tier is not None:
        if s.memory.tier.copies_pending:
            return 0
        evictions_allowed = False
    available = s.memory.num_free
    if evictions_allowed:
        available += s.memory.evictable
    running = s.running.values()
    most = len(running) * pages_for(k, s.page_size)  # each request's pages cover its tokens so far
    if most <= available or _pages_needed(running, k, s.page_size) <= available:
        return k
    lo, hi = 0, k  # largest k' <= k with pages_needed(k') <= available
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _pages_needed(running, mid, s.page_size) <= available:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _continues(s: SchedulerState, plan: Plan) -> bool:
    """Whether the plan in flight is a pure decode of exactly the running requests."""
    if plan.prefill or plan.aborted or plan.preempted or s.in_flight.held():
        return False
    if len(plan.decode) != len(s.running):
        return False
    return all(d.rid == rid for d, rid in zip(plan.decode, s.running, strict=True))


def _head_stays_out(s: SchedulerState, k: int) -> int:
    """The largest ``k' <= k`` such that admission's first candidate stays out for ``k'`` steps.

    Memory only shrinks during a run and the reservation only falls, so the
    head stays out at step ``j`` if it does not fit at the run's start with the
    reservation of step ``j``; that holds for a prefix of the run.
    """
    head = s.admission_order()[0]
    need, available = s.memory.fill_need(head)
    if not s.reservation.enabled:
        return k if need > available else 0
    running = s.running.values()
    reservation = s.reservation
    ps = s.page_size

    def stays_out(step: int) -> bool:
        reserved = reservation.tokens(running, later=step - 1)
        growth = reservation.ratio(step - 1) * reservation.future(head)  # a waiting future stays
        return need * ps + reserved + growth > available * ps

    if not stays_out(1):
        return 0
    if stays_out(k):
        return k
    lo, hi = 1, k - 1  # the last step at which it stays out
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if stays_out(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _pages_needed(running: Iterable[Request], k: int, page_size: int) -> int:
    return sum(max(0, pages_for(r.num_planned + k, page_size) - len(r.pages)) for r in running)


def _take_pages(s: SchedulerState, n: int) -> list[int]:
    """``n`` pages, one at a time as single steps take them (evicting only when none is free)."""
    memory = s.memory
    if memory.num_free >= n:
        return memory.allocator.alloc(n)
    pages = []
    for _ in range(n):
        memory.make_room(1)
        pages += memory.allocator.alloc(1)
    return pages


def advance(s: SchedulerState, k: int) -> DecodeRun:
    """Apply ``k`` pure-decode steps at once; the caller checked ``0 < k <= run_length(s, k)``
    (see ``Scheduler.advance_decode``)."""
    ps = s.page_size
    running = list(s.running.values())
    grows: list[tuple[int, int]] = []  # (step index in run, batch index)
    for idx, req in enumerate(running):
        j = len(req.pages) * ps - req.num_planned + 1  # first step needing a new page
        if j < 1:
            j = 1
        while j <= k:
            grows.append((j, idx))
            j += ps
    new_pages = [0] * k
    first_step = s.step + 1
    s.step = last = s.step + k
    if grows:
        grows.sort()
        added: dict[int, list[int]] = {}  # batch index -> its new pages, in step order
        for (j, idx), page in zip(grows, _take_pages(s, len(grows)), strict=True):
            if idx in added:
                added[idx].append(page)
            else:
                added[idx] = [page]
            new_pages[j - 1] += 1
        for idx, pages in added.items():
            running[idx].pages += tuple(pages)
    context = 0
    tokens = [PLACEHOLDER_TOKEN] * k
    for req in running:
        context += req.num_planned
        req.num_planned += k
        req.last_plan = last
        req.output += tokens
    s.reservation.decayed(k)
    blocked = Blocked.NONE
    if s.num_waiting:
        full = len(s.running) >= s.config.max_running
        blocked = Blocked.RUNNING_CAP if full else Blocked.KV_MEMORY
    in_flight = None
    if len(s.in_flight):
        slots = tuple(DecodeSlot(r.rid, r.num_planned - 1, r.pages) for r in running)
        in_flight = Plan(step=s.step, decode=slots, blocked=blocked)
        s.in_flight.replace_oldest(in_flight)
    else:
        s.in_flight.completed = s.step
    return DecodeRun(
        first_step=first_step,
        k=k,
        rids=tuple(s.running),
        context_tokens=context,
        new_pages=tuple(new_pages),
        blocked=blocked,
        in_flight=in_flight,
    )
