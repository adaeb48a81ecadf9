"""The scheduler core shared by the real engine and the simulator.

Contract: ``add`` and ``abort`` requests, ``schedule(now) -> Plan``, then
``complete(plan, tokens) -> events``. Plain Python on ints and lists: no torch,
no zmq, no clock. The same sequence of calls gives the same plans, so
tensor-parallel ranks and the simulator agree.

One step, in order:

1. release aborted requests (their pages go back, or into the prefix cache);
2. give every decoding request room for one more token, evicting unreferenced
   cache pages and, when that is not enough, preempting the policy's victim
   (recompute: its pages are released and it waits again);
3. continue chunked prefills, then admit waiting requests in policy order while
   the running cap, the prefill token budget and KV pages allow; admission stops
   at the first request that does not fit (no request overtakes the head).

A request is admitted with pages for its whole fill (prompt + output so far),
so later chunks never allocate; only decode grows a request.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from engine.scheduler.config import SchedulerConfig, SchedulerStats
from engine.scheduler.pages import PageAllocator
from engine.scheduler.plan import (
    BLOCKED_KV_MEMORY,
    BLOCKED_PREFILL_BUDGET,
    BLOCKED_RUNNING_CAP,
    DecodeRun,
    DecodeSlot,
    Event,
    Finished,
    FinishReason,
    Plan,
    Preempted,
    PrefillChunk,
    TokenOut,
)
from engine.scheduler.policy import Key, get_policy
from engine.scheduler.radix import RadixCache
from engine.scheduler.request import Request, RequestStatus

PLACEHOLDER_TOKEN = -1  # the token recorded when the caller passes no tokens (simulation)


class RequestRejected(ValueError):
    """A request that can never be served under this configuration."""


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.policy = get_policy(config.policy)
        self.page_size = config.page_size
        self.allocator = PageAllocator(config.num_pages, config.page_size)
        self.cache: RadixCache | None = RadixCache(self.allocator) if config.prefix_cache else None
        self.requests: dict[str, Request] = {}  # live requests (not yet ended)
        self._waiting: list[tuple[Key, Request]] = []  # sorted by the policy's key
        self.running: dict[str, Request] = {}  # admission order
        self._aborted: list[Request] = []  # marked, released at the next step
        self._abort_counts: dict[str, int] = {}  # output tokens of the last step's aborts
        self.step = 0
        self._seq = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0

    # ------------------------------------------------------------------ requests
    def add(self, req: Request) -> None:
        """Queue a request. Raises ``RequestRejected`` if it can never be served."""
        ps = self.page_size
        if req.rid in self.requests:
            raise RequestRejected(f"duplicate request id {req.rid!r}")
        if req.prompt_len < 1:
            raise RequestRejected(f"request {req.rid}: empty prompt")
        if req.max_new_tokens < 1:
            raise RequestRejected(f"request {req.rid}: max_new_tokens must be >= 1")
        if req.prompt and len(req.prompt) != req.prompt_len:
            raise RequestRejected(
                f"request {req.rid}: prompt_len {req.prompt_len} != len(prompt) {len(req.prompt)}"
            )
        if req.block_hashes and req.block_size % ps:
            raise RequestRejected(
                f"request {req.rid}: block size {req.block_size} is not a multiple of "
                f"page size {ps}"
            )
        need = _pages_for(req.prompt_len + req.max_new_tokens, ps)
        if need > self.config.num_pages:
            raise RequestRejected(
                f"request {req.rid}: prompt ({req.prompt_len}) + max_new_tokens "
                f"({req.max_new_tokens}) needs {need} KV pages, the cache has "
                f"{self.config.num_pages}"
            )
        req.status = RequestStatus.WAITING
        req.seq = self._seq
        self._seq += 1
        self.requests[req.rid] = req
        self._enqueue(req)

    def abort(self, rid: str) -> bool:
        """Mark a live request aborted; its pages are released at the next step."""
        req = self.requests.get(rid)
        if req is None or req.status is RequestStatus.ABORTED:
            return False
        req.status = RequestStatus.ABORTED
        req.finish_reason = FinishReason.ABORT
        self._aborted.append(req)
        return True

    def get(self, rid: str) -> Request | None:
        return self.requests.get(rid)

    def has_work(self) -> bool:
        return bool(self.running or self._waiting or self._aborted)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def waiting(self) -> list[Request]:
        """Waiting requests in the policy's static order."""
        return [r for _, r in self._waiting]

    def stats(self) -> SchedulerStats:
        free = self.allocator.num_free
        return SchedulerStats(
            num_pages=self.config.num_pages,
            pages_used=self.config.num_pages - free,
            pages_free=free,
            pages_cached=self.cache.evictable_pages if self.cache else 0,
            num_waiting=len(self._waiting),
            num_running=len(self.running),
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
        )

    # ------------------------------------------------------------------ schedule
    def schedule(self, now: float) -> Plan:
        self.step += 1
        aborted = self._release_aborted()
        preempted: list[str] = []

        for req in [r for r in self.running.values() if r.status is RequestStatus.DECODING]:
            if req.rid not in self.running:
                continue  # preempted earlier in this loop
            need = _pages_for(req.num_computed + 1, self.page_size) - len(req.pages)
            if need > 0 and not self._reserve(need, req, preempted):
                continue
            if need > 0:
                req.pages.extend(self.allocator.alloc(need))

        budget = self.config.max_prefill_tokens
        chunks: list[PrefillChunk] = []
        for req in self.running.values():
            if req.status is RequestStatus.PREFILLING and budget > 0:
                budget -= self._chunk(req, budget, chunks)
        blocked = self._admit(budget, chunks)

        decode = tuple(
            DecodeSlot(r.rid, r.num_computed, r.page_table())
            for r in self.running.values()
            if r.status is RequestStatus.DECODING
        )
        return Plan(
            step=self.step,
            now=now,
            prefill=tuple(chunks),
            decode=decode,
            preempted=tuple(preempted),
            aborted=tuple(aborted),
            blocked=blocked,
        )

    def _admit(self, budget: int, chunks: list[PrefillChunk]) -> str:
        if not self._waiting:
            return ""
        cap = self.config.max_running
        candidates = self._candidates()
        admitted: list[Request] = []
        blocked = ""
        for req in candidates:
            if len(self.running) >= cap:
                blocked = BLOCKED_RUNNING_CAP
                break
            if budget <= 0:
                blocked = BLOCKED_PREFILL_BUDGET
                break
            if not self._allocate_fill(req):
                blocked = BLOCKED_KV_MEMORY
                break
            admitted.append(req)
            self.running[req.rid] = req
            budget -= self._chunk(req, budget, chunks)
        if admitted and not self.policy.reorders:
            del self._waiting[: len(admitted)]  # admission took a prefix of the queue
        elif admitted:
            gone = {r.rid for r in admitted}
            self._waiting = [e for e in self._waiting if e[1].rid not in gone]
        return blocked

    def _candidates(self) -> Sequence[Request]:
        """Waiting requests in the order admission tries them (enough to hit the cap)."""
        if self.policy.reorders:
            return self.policy.order(self.waiting(), self._cached_pages_of)
        room = self.config.max_running - len(self.running)
        return [r for _, r in self._waiting[: max(room, 0) + 1]]

    def _cached_pages_of(self, req: Request) -> int:
        if self.cache is None:
            return 0
        ps = self.page_size
        return self.cache.match_length(req.page_keys((req.fill_len - 1) // ps, ps))

    def _fill_need(self, req: Request) -> tuple[int, int]:
        """(new pages ``req``'s fill needs, pages it may take: free + evictable outside its match).

        Read-only. The match leaves at least one token to compute, so the last
        chunk yields logits.
        """
        ps = self.page_size
        total = _pages_for(req.fill_len, ps)
        if self.cache is None:
            return total, self.allocator.num_free
        matched, locked = self.cache.probe(req.page_keys((req.fill_len - 1) // ps, ps))
        return total - matched, self.allocator.num_free + self.cache.evictable_pages - locked

    def _allocate_fill(self, req: Request) -> bool:
        """Give ``req`` its cached prefix plus fresh pages for the rest of its fill."""
        need, available = self._fill_need(req)
        if need > available:
            return False
        ps = self.page_size
        shared: list[int] = []
        if self.cache is not None:
            shared, node = self.cache.match(req.page_keys((req.fill_len - 1) // ps, ps), self.step)
            self.cache.lock(node)
            req.cache_node = node
        self._make_room(need)
        req.pages = shared + self.allocator.alloc(need)
        req._table = ()
        req.num_shared_pages = len(shared)
        req.num_computed = req.num_cached = len(shared) * ps
        req.status = RequestStatus.PREFILLING
        self.prompt_tokens += req.fill_len
        self.cached_tokens += req.num_cached
        return True

    def _chunk(self, req: Request, budget: int, chunks: list[PrefillChunk]) -> int:
        length = min(req.fill_len - req.num_computed, budget)
        samples = req.num_computed + length == req.fill_len
        chunks.append(PrefillChunk(req.rid, req.num_computed, length, samples, req.page_table()))
        return length

    def _reserve(self, need: int, requester: Request, preempted: list[str]) -> bool:
        """Make ``need`` pages free, preempting victims; False if ``requester`` was the victim."""
        while self.allocator.num_free < need:
            if self.cache is not None and self.cache.evict(need - self.allocator.num_free):
                continue
            victim = self.policy.victim(list(self.running.values()))
            self._preempt(victim)
            preempted.append(victim.rid)
            if victim is requester:
                return False
        return True

    def _make_room(self, need: int) -> None:
        short = need - self.allocator.num_free
        if short > 0 and self.cache is not None:
            self.cache.evict(short)

    def _preempt(self, req: Request) -> None:
        del self.running[req.rid]
        self._release(req)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self._enqueue(req)

    # ------------------------------------------------------------------ complete
    def complete(self, plan: Plan, tokens: Mapping[str, int] | None) -> list[Event]:
        """Apply the sampled ``tokens`` (rid -> token id; None in simulation) of ``plan``."""
        events: list[Event] = []
        for rid in plan.aborted:
            events.append(Finished(rid, FinishReason.ABORT, self._abort_counts.pop(rid, 0)))
        for rid in plan.preempted:
            events.append(Preempted(rid))
        for chunk in plan.prefill:
            req = self.running.get(chunk.rid)
            if req is None or req.status is RequestStatus.ABORTED:
                continue  # aborted or preempted since the plan was made: nothing to keep
            req.num_computed = chunk.start + chunk.length
            self._share_prefix(req)
            if chunk.samples:
                req.status = RequestStatus.DECODING
                self._append(req, tokens, events)
        for slot in plan.decode:
            req = self.running.get(slot.rid)
            if req is None or req.status is RequestStatus.ABORTED:
                continue
            req.num_computed = slot.position + 1
            self._append(req, tokens, events)
        return events

    def _append(self, req: Request, tokens: Mapping[str, int] | None, events: list[Event]) -> None:
        token = PLACEHOLDER_TOKEN if tokens is None else tokens[req.rid]
        events.append(TokenOut(req.rid, token, not req.output))
        req.output.append(token)
        if token in req.stop_token_ids:
            self._finish(req, FinishReason.STOP, events)
        elif len(req.output) >= req.max_new_tokens:
            self._finish(req, FinishReason.LENGTH, events)

    def _finish(self, req: Request, reason: FinishReason, events: list[Event]) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        del self.running[req.rid]
        del self.requests[req.rid]
        self._release(req)
        events.append(Finished(req.rid, reason, len(req.output)))

    def _share_prefix(self, req: Request) -> None:
        """Hand a request's computed full pages to the prefix cache as soon as a chunk is done,
        so requests running at the same time share them; the request keeps them locked.

        Where the cache already holds a page for the same key (another request computed the
        same prefix meanwhile), the request switches to the cached page and frees its own.
        """
        cache = self.cache
        if cache is None:
            return
        ps = self.page_size
        keys = req.page_keys(req.num_computed // ps, ps)
        n = len(keys)
        if n <= req.num_shared_pages:
            return
        rejected = cache.insert(keys, req.pages[:n], self.step)
        pages, node = cache.match(keys, self.step)
        cache.lock(node)
        if req.cache_node is not None:
            cache.unlock(req.cache_node)
        self.allocator.free(rejected)
        req.pages[:n] = pages
        req._table = ()
        req.num_shared_pages = n
        req.cache_node = node

    # ------------------------------------------------------------------ release
    def _release_aborted(self) -> list[str]:
        if not self._aborted:
            return []
        rids = []
        gone = set()
        self._abort_counts = {}
        for req in self._aborted:
            rids.append(req.rid)
            self._abort_counts[req.rid] = len(req.output)
            gone.add(req.rid)
            self.running.pop(req.rid, None)
            del self.requests[req.rid]
            self._release(req)
        self._waiting = [e for e in self._waiting if e[1].rid not in gone]
        self._aborted = []
        return rids

    def _release(self, req: Request) -> None:
        """Return a request's pages: computed full pages into the prefix cache, the rest freed."""
        pages = req.pages
        if not pages:
            return
        if self.cache is None:
            self.allocator.free(pages)
        else:
            keys = req.page_keys(req.num_computed // self.page_size, self.page_size)
            n = len(keys)
            rejected = self.cache.insert(keys, pages[:n], self.step)
            self.allocator.free(rejected)
            self.allocator.free(pages[n:])
            if req.cache_node is not None:
                self.cache.unlock(req.cache_node)
        req.pages = []
        req._table = ()
        req.cache_node = None
        req.num_shared_pages = 0
        req.num_computed = 0

    def _enqueue(self, req: Request) -> None:
        bisect.insort(self._waiting, ((*self.policy.key(req), req.seq), req))

    # ------------------------------------------------------------------ decode runs
    def decode_run_length(self, max_steps: int) -> int:
        """How many following steps are identical pure-decode steps (0 if none).

        Holds while nothing is added or aborted: every running request is
        decoding, none can finish by length within the run, nothing waiting
        can be admitted (the queue is empty or the running cap binds) and the
        pages the run allocates are free or evictable. Stop tokens are not
        foreseen: this is for callers that pass no tokens (simulation).
        """
        if self._aborted or not self.running or max_steps <= 0:
            return 0
        evictions_allowed = True
        if self._waiting and len(self.running) < self.config.max_running:
            if not self._head_exceeds_memory():
                return 0
            # the head stays out while memory only shrinks; under a reordering policy the
            # order may change with the cache, so the run must not evict
            evictions_allowed = not self.policy.reorders
        k = max_steps
        for req in self.running.values():
            if req.status is not RequestStatus.DECODING:
                return 0
            k = min(k, req.remaining_tokens - 1)
        if k <= 0:
            return 0
        available = self.allocator.num_free
        if self.cache is not None and evictions_allowed:
            available += self.cache.evictable_pages
        if self._pages_needed(k) <= available:
            return k
        lo, hi = 0, k  # largest k' with pages_needed(k') <= available
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._pages_needed(mid) <= available:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _head_exceeds_memory(self) -> bool:
        """Whether the request that admission would try first lacks KV pages right now."""
        need, available = self._fill_need(self._candidates()[0])
        return need > available

    def _pages_needed(self, k: int) -> int:
        ps = self.page_size
        return sum(
            max(0, _pages_for(r.num_computed + k, ps) - len(r.pages)) for r in self.running.values()
        )

    def advance_decode(self, k: int, now: float) -> DecodeRun:
        """Apply ``k`` pure-decode steps at once, as ``k`` x (schedule + complete(None)).

        ``k`` must not exceed ``decode_run_length(k)``. Pages are allocated in
        the order the single steps would allocate them (step, then batch order).
        """
        if k <= 0 or k > self.decode_run_length(k):
            raise ValueError(f"cannot advance {k} decode steps from this state")
        ps = self.page_size
        running = list(self.running.values())
        grows: list[tuple[int, int]] = []  # (step index in run, batch index)
        for idx, req in enumerate(running):
            first = len(req.pages) * ps - req.num_computed + 1  # first step needing a new page
            grows.extend((j, idx) for j in range(max(first, 1), k + 1, ps))
        grows.sort()
        new_pages = [0] * k
        for j, idx in grows:
            self._make_room(1)
            running[idx].pages.extend(self.allocator.alloc(1))
            new_pages[j - 1] += 1
        context = 0
        for req in running:
            context += req.num_computed
            req.num_computed += k
            req.output.extend([PLACEHOLDER_TOKEN] * k)
        blocked = ""
        if self._waiting:
            full = len(self.running) >= self.config.max_running
            blocked = BLOCKED_RUNNING_CAP if full else BLOCKED_KV_MEMORY
        first_step = self.step + 1
        self.step += k
        return DecodeRun(
            first_step=first_step,
            k=k,
            rids=tuple(r.rid for r in running),
            context_tokens=context,
            new_pages=tuple(new_pages),
            blocked=blocked,
        )


def _pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)
