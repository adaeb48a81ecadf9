"""Prefill/decode roles of the scheduler core: the hand-off, the held pages, the incoming
request's reservation and landing, and aborts or failures at each point
(``core.scheduler.handoff``). The random interleavings are in
``test_scheduler_handoff_properties``."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from core.scheduler import Request, RequestRejected, RequestStatus, Scheduler, SchedulerConfig
from core.scheduler.invariants import check_invariants, page_owners
from core.scheduler.plan import (
    Blocked,
    DecodeSlot,
    Event,
    Finished,
    FinishReason,
    Plan,
    Receive,
    TokenOut,
    Transfer,
)
from core.settings import settings_of

PS = 4


def scheduler(role: str, num_pages: int = 16, **kw: Any) -> Scheduler:
    return Scheduler(SchedulerConfig(num_pages=num_pages, page_size=PS, role=role, **kw))


def request(rid: str, prompt: Sequence[int], max_new: int, stop: Sequence[int] = ()) -> Request:
    return Request(
        rid,
        prompt_len=len(prompt),
        prompt=list(prompt),
        max_new_tokens=max_new,
        stop_token_ids=frozenset(stop),
    )


def token_of(rid: str, index: int) -> int:
    """The token a deterministic model samples as ``rid``'s output number ``index``."""
    return zlib.crc32(f"{rid}:{index}".encode()) % 50 + 100


def step(s: Scheduler, now: float = 0.0) -> tuple[Plan, list[Event]]:
    """One strictly alternated step, sampling ``token_of``."""
    plan = s.schedule(now)
    tokens = {}
    for c in plan.prefill:
        if c.samples:
            req = s.get(c.rid)
            assert req is not None
            tokens[c.rid] = token_of(c.rid, c.start + c.length - req.prompt_len)
    for d in plan.decode:
        req = s.get(d.rid)
        assert req is not None
        tokens[d.rid] = token_of(d.rid, d.position + 1 - req.prompt_len)
    events = s.complete(plan, tokens)
    check_invariants(s)
    return plan, events


def drain(s: Scheduler) -> list[Event]:
    events: list[Event] = []
    for _ in range(200):
        if not s.has_work():
            return events
        events += step(s)[1]
    raise AssertionError("the scheduler never went idle")


def all_back(s: Scheduler) -> bool:
    """Every page is free or evictable cache."""
    stats = s.stats()
    return stats.pages_free + stats.pages_cached == stats.num_pages


# ---------------------------------------------------------------------- prefill role
def test_prefill_hands_off_after_the_first_token_and_holds_the_pages() -> None:
    s = scheduler("prefill")
    req = request("a", range(10), 8)
    s.add(req)
    plan, events = step(s)
    assert events == [TokenOut("a", token_of("a", 0), True), Finished("a", FinishReason.HANDOFF, 1)]
    pages = plan.prefill[0].pages
    assert s.transfer("a") == Transfer("a", pages, 10, tuple(range(10)), token_of("a", 0), 8)
    assert req.max_new_tokens == 8, "the request's own limit is given back"
    assert not s.has_work(), "a held transfer is the caller's to end, not a step's"
    stats = s.stats()
    assert (stats.pages_free, stats.pages_cached) == (13, 0), "held: not free, not evictable"
    owners = page_owners(s)
    assert [owners[p] for p in pages] == ["cache", "cache", "transfer"]  # full pages shared

    s.add(request("big", range(100, 153), 1))  # 14 pages: 13 are free, none evictable
    assert step(s)[0].blocked is Blocked.KV_MEMORY
    s.abort("big")
    step(s)

    assert s.transfer_done("a")
    assert s.transfer("a") is None and not s.transfer_done("a") and not s.abort("a")
    assert all_back(s) and s.stats().pages_cached == 2, "full pages cached, the rest free"
    check_invariants(s)


def test_prefill_never_places_a_decode_slot_with_overlap() -> None:
    s = scheduler("prefill")
    s.add(request("a", range(6), 5))
    first = s.schedule(0.0)
    second = s.schedule(0.1)  # made while the sampling chunk is in flight
    assert first.prefill and not second.decode and not second.prefill
    check_invariants(s)
    events = s.complete(first, {"a": 7})
    assert events[-1] == Finished("a", FinishReason.HANDOFF, 1)
    assert s.complete(second, {}) == []
    check_invariants(s)
    assert s.transfer("a") is not None


@pytest.mark.parametrize(("max_new", "stop"), [(1, ()), (5, (token_of("a", 0),))])
def test_prefill_ends_a_request_whose_first_token_ends_it(max_new: int, stop: tuple[int]) -> None:
    s = scheduler("prefill")
    s.add(request("a", range(6), max_new, stop))
    reason = FinishReason.STOP if stop else FinishReason.LENGTH
    assert step(s)[1][-1] == Finished("a", reason, 1)
    assert s.transfer("a") is None and all_back(s)


def test_a_failed_transfer_releases_the_pages_as_an_abort() -> None:
    """abort(rid) of a held transfer: its computed pages go to the prefix cache (their KV is
    intact), the rest are freed, at once; a later request with the prompt hits the cache."""
    s = scheduler("prefill")
    s.add(request("a", range(10), 8))
    step(s)
    assert s.abort("a")
    assert not s.abort("a") and not s.transfer_done("a")
    assert all_back(s) and s.stats().pages_cached == 2
    again = request("b", range(10), 8)
    s.add(again)
    step(s)
    assert again.num_cached == 2 * PS
    check_invariants(s)


def test_prefill_abort_before_the_hand_off_gives_the_limit_back() -> None:
    s = scheduler("prefill", max_prefill_tokens=4)
    req = request("a", range(10), 8)
    s.add(req)
    step(s)  # a first chunk
    assert s.abort("a")
    _, events = step(s)
    assert events == [Finished("a", FinishReason.ABORT, 0)]
    assert req.max_new_tokens == 8 and s.transfer("a") is None and all_back(s)


def test_prefill_rejects_a_request_id_still_held_for_transfer() -> None:
    s = scheduler("prefill")
    s.add(request("a", range(6), 5))
    step(s)
    with pytest.raises(RequestRejected, match="duplicate"):
        s.add(request("a", range(6), 5))


# ---------------------------------------------------------------------- decode role
def incoming(s: Scheduler, rid: str, prompt: Sequence[int], max_new: int) -> Request:
    req = request(rid, prompt, max_new)
    s.add_incoming(req, token_of(rid, 0))
    return req


def test_decode_reserves_pages_and_decodes_only_after_they_landed() -> None:
    s = scheduler("decode")
    req = incoming(s, "a", range(8), 4)
    plan, _ = step(s)
    assert not plan.has_model_work
    assert req.status is RequestStatus.RECEIVING
    assert len(req.pages) == 3, "pages for the prompt (8 tokens) plus the first token"
    assert s.take_receives() == [Receive("a", 0, req.pages[:2])]
    assert s.take_receives() == []
    assert not step(s)[0].has_model_work, "never placed before its KV landed"
    assert s.has_work()

    assert s.kv_landed("a")
    plan, events = step(s)
    assert plan.decode == (DecodeSlot("a", 8, req.pages),) and not plan.prefill
    assert events == [TokenOut("a", token_of("a", 1), False)]
    events = drain(s)
    assert events[-1] == Finished("a", FinishReason.LENGTH, 4)
    assert req.output == [token_of("a", i) for i in range(4)]
    assert all_back(s)


def test_decode_request_waits_for_pages_like_any_admission() -> None:
    s = scheduler("decode", num_pages=6)
    first = incoming(s, "a", range(12), 4)  # 4 pages with its first token
    second = incoming(s, "b", range(20, 32), 4)
    plan, _ = step(s)
    assert plan.blocked is Blocked.KV_MEMORY and second.status is RequestStatus.INCOMING
    assert [r.rid for r in s.take_receives()] == ["a"]
    s.kv_landed("a")
    events = drain_until(s, lambda: second.status is RequestStatus.RECEIVING)
    assert Finished("a", FinishReason.LENGTH, 4) in events and not first.pages
    assert [r.rid for r in s.take_receives()] == ["b"]


def drain_until(s: Scheduler, done: Callable[[], bool]) -> list[Event]:
    events: list[Event] = []
    for _ in range(50):
        events += step(s)[1]
        if done():
            return events
    raise AssertionError("never happened")


@pytest.mark.parametrize("point", ["waiting for pages", "in transfer", "decoding"])
def test_decode_abort_at_any_point_frees_everything(point: str) -> None:
    s = scheduler("decode", num_pages=6)
    incoming(s, "hog", range(100, 112), 4)
    step(s)
    req = incoming(s, "a", range(12), 4)
    if point != "waiting for pages":
        s.abort("hog")
        step(s)
        step(s)
        assert req.status is RequestStatus.RECEIVING
    if point == "decoding":
        s.kv_landed("a")
        step(s)
        assert req.status is RequestStatus.DECODING
    assert s.abort("a")
    _, events = step(s)
    assert Finished("a", FinishReason.ABORT, len(req.output)) in events
    assert not req.pages and s.get("a") is None
    assert not s.kv_landed("a"), "a landing after the abort is ignored"
    assert "a" not in [r.rid for r in s.take_receives()]
    s.abort("hog")
    drain(s)
    assert all_back(s)


def test_decode_never_preempts_a_request_whose_kv_is_in_transfer() -> None:
    """Its pages are being written: a decoding request that runs out of pages preempts
    itself (and later recomputes here) rather than the later, receiving request."""
    s = scheduler("decode", num_pages=6)
    a = incoming(s, "a", range(7), 4)  # 2 pages with its first token
    step(s)
    s.kv_landed("a")
    b = incoming(s, "b", range(20, 32), 4)  # the other 4 pages
    step(s)  # a decodes position 7; b is admitted
    assert b.status is RequestStatus.RECEIVING
    plan, _ = step(s)  # a's position 8 needs a third page
    assert plan.preempted == ("a",) and b.status is RequestStatus.RECEIVING
    s.take_receives()
    s.kv_landed("b")
    events = drain(s)
    assert Finished("a", FinishReason.LENGTH, 4) in events
    assert a.output == [token_of("a", i) for i in range(4)], "recomputed, the same tokens"


def test_decode_prefix_cache_serves_incoming_requests() -> None:
    """A prompt whose full pages the decode side holds already moves only the rest."""
    s = scheduler("decode")
    incoming(s, "a", range(10), 3)
    step(s)
    s.take_receives()
    s.kv_landed("a")  # its full prompt pages enter the cache at once
    b = incoming(s, "b", range(10), 3)
    step(s)
    (receive,) = s.take_receives()
    assert receive == Receive("b", 2, b.pages[2:3]), "two cached pages, one to move"
    s.kv_landed("b")
    drain(s)
    assert all_back(s)


def test_roles_take_their_own_requests() -> None:
    with pytest.raises(RequestRejected, match="takes it with its KV"):
        scheduler("decode").add(request("a", range(6), 5))
    for role in ("colocated", "prefill"):
        with pytest.raises(RequestRejected, match="takes no KV"):
            scheduler(role).add_incoming(request("a", range(6), 5), 1)
    d = scheduler("decode")
    with pytest.raises(RequestRejected, match="nothing to decode"):
        d.add_incoming(request("a", range(6), 1), 1)
    with pytest.raises(RequestRejected, match="nothing to decode"):
        d.add_incoming(request("a", range(6), 5, stop=[1]), 1)
    incoming(d, "a", range(6), 5)
    with pytest.raises(ValueError, match="no KV in transfer"):
        d.kv_landed("a")  # not admitted yet: no pages to have landed in
    assert not d.kv_landed("nobody")
    with pytest.raises(ValueError, match="unknown role"):
        SchedulerConfig(role="both")
    assert "role" not in {f.name for f in settings_of(SchedulerConfig)}, "set per instance"


def test_a_hand_off_gives_the_tokens_of_a_colocated_run() -> None:
    """Prefill and decode instances, their transfers in between, deliver what one colocated
    scheduler does (with pools too small to hold every request at once on either side)."""
    prompts = {f"r{i}": [i % 3] * (3 + 5 * i) for i in range(6)}
    limits = {rid: 2 + i for i, rid in enumerate(prompts)}
    colocated = scheduler("colocated", num_pages=64)
    for rid, prompt in prompts.items():
        colocated.add(request(rid, prompt, limits[rid]))
    expected = outputs(drain(colocated))

    p, d = scheduler("prefill", num_pages=12), scheduler("decode", num_pages=16)
    for rid, prompt in prompts.items():
        p.add(request(rid, prompt, limits[rid]))
    events: list[Event] = []
    for _ in range(100):
        if p.has_work():
            new = step(p)[1]
            events += new
            for e in new:
                if isinstance(e, Finished) and e.reason is FinishReason.HANDOFF:
                    ship = p.transfer(e.rid)
                    assert ship is not None
                    d.add_incoming(
                        request(e.rid, ship.prompt, ship.max_new_tokens), ship.first_token
                    )
        if d.has_work():
            events += step(d)[1]
        for receive in d.take_receives():
            ship = p.transfer(receive.rid)
            assert ship is not None and len(ship.pages) == receive.first + len(receive.pages)
            assert d.kv_landed(receive.rid) and p.transfer_done(receive.rid)
    assert outputs(events) == expected
    assert not p.has_work() and not d.has_work() and all_back(p) and all_back(d)


def outputs(events: list[Event]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in events:
        if isinstance(e, TokenOut):
            out.setdefault(e.rid, []).append(e.token)
    return out
