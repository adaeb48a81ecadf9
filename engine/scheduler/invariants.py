"""Invariants of the scheduler core, checked by the property tests.

pages:   free + cached (radix) + private (requests) == all pages, each exactly once
shared:  a request's first ``num_shared_pages`` pages are radix pages it keeps locked
refs:    node.ref == number of running requests whose locked prefix passes through it
counts:  the cache's cached/evictable page counters match the tree
state:   running requests are prefilling or decoding, waiting ones hold no pages,
         no request holds more output than its limit
"""

from __future__ import annotations

from collections import Counter

from engine.scheduler.request import RequestStatus
from engine.scheduler.scheduler import Scheduler


class InvariantError(AssertionError):
    pass


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise InvariantError(msg)


def check_invariants(s: Scheduler) -> None:
    total = s.config.num_pages
    ps = s.page_size
    owner: dict[int, str] = {}

    def claim(page: int, who: str) -> None:
        _check(0 <= page < total, f"page {page} out of range (owner {who})")
        _check(page not in owner, f"page {page} owned by {owner.get(page)} and {who}")
        owner[page] = who

    for p in s.allocator.free_pages():
        claim(p, "free")
    tree_pages: set[int] = set()
    if s.cache is not None:
        cached = evictable = 0
        for node in s.cache.nodes():
            _check(node.ref >= 0, f"negative refcount {node.ref}")
            _check(len(node.keys) == len(node.pages) > 0, "node keys and pages disagree")
            cached += len(node.pages)
            if node.ref == 0:
                evictable += len(node.pages)
            for p in node.pages:
                claim(p, "cache")
                tree_pages.add(p)
        _check(cached == s.cache.cached_pages, "cached page counter is off")
        leaves = {n for n in s.cache.nodes() if not n.children and n.ref == 0}
        _check(leaves == s.cache.evictable_leaves, "the evictable leaf set is off")
        _check(evictable == s.cache.evictable_pages, "evictable page counter is off")

    locks: Counter[int] = Counter()
    for rid, req in s.running.items():
        _check(req.rid == rid, "running map key mismatch")
        _check(
            req.status in (RequestStatus.PREFILLING, RequestStatus.DECODING, RequestStatus.ABORTED),
            f"{rid} is running with status {req.status}",
        )
        _check(req.num_computed <= req.fill_len, f"{rid} computed past its sequence")
        _check(len(req.pages) * ps >= req.num_computed, f"{rid} has too few pages")
        if req.status is RequestStatus.PREFILLING:
            _check(len(req.pages) * ps >= req.fill_len, f"{rid} prefilling without its pages")
        table = req._table
        _check(
            len(table) != len(req.pages) or table == tuple(req.pages),
            f"{rid} has a stale page table",
        )
        for p in req.pages[: req.num_shared_pages]:
            _check(p in tree_pages, f"{rid} shares page {p} that the cache does not hold")
        for p in req.pages[req.num_shared_pages :]:
            claim(p, rid)
        locked = req.cache_node
        while s.cache is not None and locked is not None and locked is not s.cache.root:
            locks[id(locked)] += 1
            locked = locked.parent
    if s.cache is not None:
        for node in s.cache.nodes():
            _check(
                node.ref == locks[id(node)],
                f"node ref {node.ref} but {locks[id(node)]} requests lock it",
            )
    _check(len(owner) == total, f"{total - len(owner)} pages are lost")

    for req in s.waiting():
        _check(not req.pages, f"waiting {req.rid} holds pages")
        _check(req.status is not RequestStatus.FINISHED, f"finished {req.rid} is waiting")
    for req in s.requests.values():
        _check(len(req.output) <= req.max_new_tokens, f"{req.rid} exceeded max_new_tokens")
