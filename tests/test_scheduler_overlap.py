"""Focused tests of overlap scheduling in the core: a plan made while another is in flight."""

from __future__ import annotations

import pytest

from core.scheduler import (
    Finished,
    FinishReason,
    PlanOrderError,
    Request,
    Scheduler,
    SchedulerConfig,
    TokenOut,
)


def req(rid: str, n: int, out: int = 4, base: int = 0, **kw: object) -> Request:
    return Request(
        rid=rid, prompt_len=n, prompt=[base + i for i in range(n)], max_new_tokens=out, **kw
    )  # type: ignore[arg-type]


def test_plans_complete_in_order_with_at_most_two_outstanding() -> None:
    s = Scheduler(SchedulerConfig(num_pages=16, page_size=4))
    s.add(req("a", 4, out=8))
    first = s.schedule(0.0)
    second = s.schedule(1.0)
    with pytest.raises(PlanOrderError, match="outstanding"):
        s.schedule(2.0)
    with pytest.raises(PlanOrderError, match="oldest outstanding plan is step 1"):
        s.complete(second, {"a": 1})
    s.complete(first, {"a": 1})
    s.complete(second, {"a": 2})
    with pytest.raises(PlanOrderError):
        s.complete(second, {"a": 3})


def test_the_next_plan_continues_where_the_plan_in_flight_ends() -> None:
    s = Scheduler(SchedulerConfig(num_pages=16, page_size=4, max_prefill_tokens=4))
    s.add(req("a", 6, out=8))
    chunk1 = s.schedule(0.0)
    chunk2 = s.schedule(1.0)  # planned while chunk 1 is in flight
    assert [(c.start, c.length, c.samples) for c in chunk1.prefill] == [(0, 4, False)]
    assert [(c.start, c.length, c.samples) for c in chunk2.prefill] == [(4, 2, True)]
    s.complete(chunk1, {})
    decode = s.schedule(2.0)  # chunk 2 samples the token this slot feeds: position == len(sequence)
    assert [(d.rid, d.position) for d in decode.decode] == [("a", 6)]
    assert s.complete(chunk2, {"a": 11}) == [TokenOut("a", 11, True)]
    assert s.complete(decode, {"a": 12}) == [TokenOut("a", 12, False)]


def test_a_stop_seen_one_step_late_discards_the_extra_token_and_holds_the_pages() -> None:
    s = Scheduler(SchedulerConfig(num_pages=4, page_size=4, prefix_cache=False))
    s.add(req("a", 4, out=8, stop_token_ids=frozenset({99})))
    prefill = s.schedule(0.0)
    s.complete(prefill, {"a": 1})
    step_n = s.schedule(1.0)
    step_n1 = s.schedule(2.0)  # "a" is placed again before step N's stop token is known
    assert [d.position for d in step_n1.decode] == [5]
    assert s.complete(step_n, {"a": 99}) == [
        TokenOut("a", 99, False),
        Finished("a", FinishReason.STOP, 2),
    ]
    assert s.stats().pages_free == 2, "step N+1 still writes a's pages"
    assert s.complete(step_n1, {"a": 7}) == [], "the extra token never reaches the client"
    assert s.stats().pages_free == 4
    assert not s.has_work()


def test_a_reused_request_id_gets_no_token_from_the_old_request_s_slot() -> None:
    s = Scheduler(SchedulerConfig(num_pages=16, page_size=4))
    s.add(req("a", 4, out=8, stop_token_ids=frozenset({99})))
    s.complete(s.schedule(0.0), {"a": 1})
    step_n = s.schedule(1.0)
    step_n1 = s.schedule(2.0)
    s.complete(step_n, {"a": 99})  # "a" ends; its slot in step N+1 is stale
    s.add(req("a", 4, out=8, base=50))
    step_n2 = s.schedule(3.0)
    assert [c.rid for c in step_n2.prefill] == ["a"]
    assert s.complete(step_n1, {"a": 5}) == []
    assert s.complete(step_n2, {"a": 6}) == [TokenOut("a", 6, True)]


def test_a_request_whose_last_token_is_in_flight_is_not_placed_again() -> None:
    s = Scheduler(SchedulerConfig(num_pages=16, page_size=4))
    s.add(req("a", 4, out=2))
    prefill = s.schedule(0.0)  # samples token 1
    decode = s.schedule(1.0)  # samples token 2, the last
    s.complete(prefill, {"a": 1})
    idle = s.schedule(2.0)
    assert not idle.has_model_work
    events = s.complete(decode, {"a": 2})
    assert events[-1] == Finished("a", FinishReason.LENGTH, 2)
    assert s.complete(idle, {}) == []


def test_growth_waits_for_pages_the_plan_in_flight_still_uses() -> None:
    s = Scheduler(SchedulerConfig(num_pages=4, page_size=4, prefix_cache=False))
    s.add(req("a", 7, out=9))
    s.add(req("b", 7, out=9, base=20))
    s.complete(s.schedule(0.0), {"a": 1, "b": 1})  # two pages each, none free
    step_n = s.schedule(1.0)  # position 7 still fits
    s.abort("a")
    step_n1 = s.schedule(2.0)  # b needs a page; a's come back when step N completes
    assert step_n1.aborted == ("a",) and not step_n1.preempted and not step_n1.has_model_work
    assert s.stats().pages_free == 0
    assert s.complete(step_n, {"a": 5, "b": 2}) == [TokenOut("b", 2, False)]
    assert s.stats().pages_free == 2
    assert s.complete(step_n1, {}) == [Finished("a", FinishReason.ABORT, 1)]
    assert [(d.rid, d.position) for d in s.schedule(3.0).decode] == [("b", 8)]


def test_a_victim_in_flight_keeps_its_pages_until_that_plan_completes() -> None:
    s = Scheduler(SchedulerConfig(num_pages=4, page_size=4, prefix_cache=False))
    s.add(req("a", 7, out=9))
    s.add(req("b", 7, out=9, base=20))
    s.complete(s.schedule(0.0), {"a": 1, "b": 1})
    step_n = s.schedule(1.0)
    step_n1 = s.schedule(2.0)  # both need a third page: b, the fcfs victim, is preempted
    assert step_n1.preempted == ("b",) and not step_n1.has_model_work, "a waits for b's pages"
    assert s.stats().pages_free == 0, "step N still writes b's pages"
    assert s.complete(step_n, {"a": 2, "b": 2}) == [TokenOut("a", 2, False)]
    assert s.stats().pages_free == 2
    assert [e.rid for e in s.complete(step_n1, {})] == ["b"]
    assert [(d.rid, d.position) for d in s.schedule(3.0).decode] == [("a", 8)]
