"""Invariants of the scheduler core, checked by the property tests.

pages:   free + cached (radix) + private (requests, receiving ones included) + held
         (for plans in flight) + held for transfer == all pages, each exactly once
shared:  a request's (or a held release's, or a held transfer's) first
         ``num_shared`` pages are radix pages it keeps locked
refs:    node.ref == number of running requests, held releases and held transfers
         whose locked prefix passes through it
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
roles:   colocated: nothing is incoming, receiving or held for transfer, no limit
         is kept aside; prefill: no plan in flight has a decode slot, a live request
         plans one output token (its own limit kept aside when above one), pages are
         held for transfer only for requests that ended; decode: nothing is held for
         transfer, an incoming request waits with its first token and no pages, a
         receiving one holds pages for its prompt plus first token, has planned its
         shared prefix only and was never placed (no plan in flight places it), and a
         decoding request may hold the page of its next position (its reservation)
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
    for held in s.held_for_transfer().values():
        claim(held.pages[held.num_shared :], "transfer")
    _check(len(owner) == total, f"{total - len(owner)} pages are lost")
    return owner


def check_invariants(s: Scheduler) -> None:
    owner = page_owners(s)
    _check_cache(s, owner)
    ps = s.page_size
    outstanding = len(s.in_flight)
    running_states = (
        RequestStatus.PREFILLING,
        RequestStatus.DECODING,
        RequestStatus.ABORTED,
        RequestStatus.RECEIVING,
    )
    for rid, req in s.running.items():
        _check(req.rid == rid, "running map key mismatch")
        _check(req.status in running_states, f"{rid} is running with status {req.status}")
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
            reserved = s.config.role == "decode" and ahead == 0  # a landed request's next page
            _check(
                len(req.pages) == pages_for(req.num_planned, ps)
                or (reserved and len(req.pages) == pages_for(req.num_planned + 1, ps)),
                f"{rid} holds extra pages",
            )
            _check_draft(s, req)
        elif req.status is RequestStatus.PREFILLING:
            _check(not req.draft_in_flight, f"prefilling {rid} has a draft in flight")
        for p in req.pages[: req.num_shared_pages]:
            _check(owner.get(p) == "cache", f"{rid} shares page {p} that the cache does not hold")
    for held in s.in_flight.held() + list(s.held_for_transfer().values()):
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
    _check_roles(s)


def _check_roles(s: Scheduler) -> None:
    """The ``roles`` invariant."""
    role = s.config.role
    held = s.held_for_transfer()
    _check(role == "prefill" or not held, f"a {role} scheduler holds pages for transfer")
    _check(role == "prefill" or not s._limits, f"a {role} scheduler keeps output limits aside")
    for rid in held:
        _check(rid not in s.requests, f"{rid} is live and held for transfer")
    if role == "prefill":
        for plan in s.in_flight.plans():
            _check(not plan.decode, f"a prefill-role plan (step {plan.step}) decodes")
        for rid, req in s.requests.items():
            _check(req.max_new_tokens == 1, f"{rid} plans {req.max_new_tokens} tokens")
        for rid in s._limits:
            _check(rid in s.requests, f"{rid} ended with its limit still kept aside")
    placed = {c.rid for p in s.in_flight.plans() for c in p.prefill}
    placed |= {d.rid for p in s.in_flight.plans() for d in p.decode}
    ps = s.page_size
    for rid, req in s.requests.items():
        if req.status is RequestStatus.INCOMING:
            _check(role == "decode", f"{rid} is incoming in a {role} scheduler")
            _check(not req.pages and len(req.output) == 1, f"incoming {rid} holds pages")
        elif req.status is RequestStatus.RECEIVING:
            _check(role == "decode", f"{rid} is receiving in a {role} scheduler")
            _check(s.running.get(rid) is req, f"receiving {rid} is not running")
            _check(len(req.output) == 1, f"receiving {rid} has {len(req.output)} tokens")
            _check(len(req.pages) == pages_for(req.fill_len, ps), f"receiving {rid}'s pages")
            _check(req.num_planned == req.num_shared_pages * ps, f"receiving {rid} planned")
            _check(req.last_plan == 0 and rid not in placed, f"{rid} placed before its KV landed")


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
    lockers += [h.node for h in s.held_for_transfer().values()]
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
