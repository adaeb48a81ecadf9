"""Invariants of the scheduler core, checked by the property tests.

pages:   free + cached (radix) + private (requests) + held (for plans in flight)
         == all pages, each exactly once
shared:  a request's (or a held release's) first ``num_shared`` pages are radix
         pages it keeps locked
refs:    node.ref == number of running requests and held releases whose locked
         prefix passes through it
counts:  the cache's cached/evictable page counters match the tree
tiers:   each cache node is on the device or the host (or both), the device part
         is a top subtree, locked nodes are on the device; host slots are free
         or a node's, each exactly once; queued writes target distinct host
         slots that cache nodes hold
state:   running requests are prefilling or decoding, waiting ones hold no pages
         and no draft, no request holds more output than its limit nor plans past it
planned: a request's planned positions fit its pages; a prefilling request's stay
         within its fill; a decoding request holds no page past its planned
         positions and is ahead of its output by at most one position per plan in
         flight plus the draft tokens of its slot in flight (at most
         ``num_draft_tokens``: ahead <= plans in flight x (1 + num_draft_tokens))
drafts:  a request with draft tokens in flight was last placed by a plan in
         flight, whose slot for it carries exactly those tokens
flight:  at most two plans are outstanding, oldest first, right after the last
         completed step
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from core.scheduler.pages import pages_for
from core.scheduler.radix import RadixCache, RadixNode
from core.scheduler.request import Request, RequestStatus
from core.scheduler.scheduler import Scheduler


class InvariantError(AssertionError):
    pass


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise InvariantError(msg)


def page_owners(s: Scheduler) -> dict[int, str]:
    """Who owns each page: ``free``, ``cache``, ``held`` or a request id."""
    total = s.config.pages
    owner: dict[int, str] = {}

    def claim(pages: Sequence[int], who: str) -> None:
        for page in pages:
            _check(0 <= page < total, f"page {page} out of range (owner {who})")
            _check(page not in owner, f"page {page} owned by {owner.get(page)} and {who}")
            owner[page] = who

    claim(s.memory.allocator.free_pages(), "free")
    cache = s.memory.cache
    if cache is not None:
        for node in cache.nodes():
            claim(node.pages, "cache")
    for req in s.running.values():
        claim(req.pages[req.num_shared_pages :], req.rid)
    for held in s.in_flight.held():
        claim(held.pages[held.num_shared :], "held")
    _check(len(owner) == total, f"{total - len(owner)} pages are lost")
    return owner


def check_invariants(s: Scheduler) -> None:
    owner = page_owners(s)
    _check_cache(s, owner)
    ps = s.page_size
    outstanding = len(s.in_flight)
    for rid, req in s.running.items():
        _check(req.rid == rid, "running map key mismatch")
        _check(
            req.status in (RequestStatus.PREFILLING, RequestStatus.DECODING, RequestStatus.ABORTED),
            f"{rid} is running with status {req.status}",
        )
        _check(len(req.pages) * ps >= req.num_planned, f"{rid} has too few pages")
        if req.status is RequestStatus.PREFILLING:
            _check(req.num_planned < req.fill_len, f"{rid} planned past its fill")
            _check(len(req.pages) * ps >= req.fill_len, f"{rid} prefilling without its pages")
        if req.status is RequestStatus.DECODING:
            ahead = req.num_planned - (req.fill_len - 1)
            _check(
                0 <= ahead <= outstanding + req.draft_in_flight,
                f"{rid} is {ahead} positions ahead of its output",
            )
            _check(req.planned_outputs <= req.max_new_tokens, f"{rid} planned past its limit")
            _check(len(req.pages) == pages_for(req.num_planned, ps), f"{rid} holds extra pages")
            _check_draft(s, req)
        elif req.status is RequestStatus.PREFILLING:
            _check(not req.draft_in_flight, f"prefilling {rid} has a draft in flight")
        for p in req.pages[: req.num_shared_pages]:
            _check(owner.get(p) == "cache", f"{rid} shares page {p} that the cache does not hold")
    for held in s.in_flight.held():
        for p in held.pages[: held.num_shared]:
            _check(owner.get(p) == "cache", f"a held release shares page {p} not in the cache")

    for req in s.waiting():
        _check(not req.pages, f"waiting {req.rid} holds pages")
        _check(not req.draft_in_flight, f"waiting {req.rid} has a draft in flight")
        _check(req.status is not RequestStatus.FINISHED, f"finished {req.rid} is waiting")
    for req in s.requests.values():
        _check(len(req.output) <= req.max_new_tokens, f"{req.rid} exceeded max_new_tokens")

    steps = [p.step for p in s.in_flight.plans()]
    _check(outstanding <= 2, f"{outstanding} plans outstanding")
    expected = list(range(s.in_flight.completed + 1, s.step + 1))
    _check(steps == expected, f"outstanding steps {steps}, expected {expected}")


def _check_draft(s: Scheduler, req: Request) -> None:
    """The ``drafts`` invariant for the decoding ``req``."""
    drafted = req.draft_in_flight
    if not drafted:
        return
    _check(drafted <= s.config.num_draft_tokens, f"{req.rid} has {drafted} draft tokens")
    plans = [p for p in s.in_flight.plans() if p.step == req.last_plan]
    _check(bool(plans), f"{req.rid} has a draft in flight but its last plan completed")
    slots = [d for d in plans[0].decode if d.rid == req.rid] if plans else []
    _check(
        [len(d.draft) for d in slots] == [drafted],
        f"{req.rid}: its plan in flight does not carry its {drafted} draft tokens",
    )


def _check_cache(s: Scheduler, owner: dict[int, str]) -> None:
    cache = s.memory.cache
    if cache is None:
        return
    cached = evictable = 0
    for node in cache.nodes():
        _check(node.ref >= 0, f"negative refcount {node.ref}")
        _check(len(node.pages) in (0, len(node.keys)), "node keys and pages disagree")
        _check(len(node.host) in (0, len(node.keys)), "node keys and host slots disagree")
        _check(bool(node.pages or node.host), f"node {node.id} is on neither tier")
        cached += len(node.pages)
        if node.ref == 0:
            evictable += len(node.pages)
    _check(cached == cache.cached_pages, "cached page counter is off")
    leaves = {
        n
        for n in cache.nodes()
        if n.pages and n.ref == 0 and not any(c.pages for c in n.children.values())
    }
    _check(leaves == cache.evictable_leaves, "the evictable leaf set is off")
    _check_tiers(s)
    _check(evictable == cache.evictable_pages, "evictable page counter is off")

    locks: Counter[int] = Counter()
    lockers: list[RadixNode | None] = [r.cache_node for r in s.running.values()]
    lockers += [h.node for h in s.in_flight.held()]
    for locked in lockers:
        while locked is not None and locked is not cache.root:
            locks[id(locked)] += 1
            locked = locked.parent
    for node in cache.nodes():
        _check(
            node.ref == locks[id(node)],
            f"node ref {node.ref} but {locks[id(node)]} requests lock it",
        )


def _check_tiers(s: Scheduler) -> None:
    cache, tier = s.memory.cache, s.memory.tier
    assert cache is not None
    for node in cache.nodes():
        parent = node.parent
        assert parent is not None
        if node.pages:
            _check(parent is cache.root or bool(parent.pages), f"node {node.id}: parent off device")
        _check(node.ref == 0 or bool(node.pages), f"locked node {node.id} is not on the device")
    host_leaves = {n for n in cache.nodes() if not n.pages and not n.children}
    _check(host_leaves == cache.host_leaves, "the host leaf set is off")
    if tier is None:
        _check(not any(n.host for n in cache.nodes()), "host slots without a host tier")
        return
    owner = _host_owners(cache, tier.slots.free_pages(), tier.num_slots)
    targets = [slot for _, slot in tier.pending_writes()]
    _check(len(set(targets)) == len(targets), "two queued writes target one host slot")
    for slot in targets:
        _check(owner.get(slot) == "cache", f"a queued write targets host slot {slot} not cached")


def _host_owners(cache: RadixCache, free: list[int], total: int) -> dict[int, str]:
    owner: dict[int, str] = {}
    for who, slots in [("free", free), *(("cache", n.host) for n in cache.nodes())]:
        for slot in slots:
            _check(0 <= slot < total, f"host slot {slot} out of range")
            _check(slot not in owner, f"host slot {slot} owned twice")
            owner[slot] = who
    _check(len(owner) == total, f"{total - len(owner)} host slots are lost")
    return owner
