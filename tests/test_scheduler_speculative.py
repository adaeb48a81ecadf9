"""Speculative decoding in the scheduler core: draft tokens on decode slots, their verification,
the rollback of rejected positions, and the drafters (focused cases; the properties are in
``test_scheduler_speculative_properties``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
import tier_workload
from tier_workload import run_workload

from core.scheduler import (
    PLACEHOLDER_TOKEN,
    DecodeSlot,
    Drafter,
    Finished,
    FinishReason,
    NgramDrafter,
    PlaceholderDrafter,
    Plan,
    Preempted,
    Request,
    Scheduler,
    SchedulerConfig,
    TokenOut,
)
from core.scheduler.invariants import check_invariants

# ---------------------------------------------------------------------------- the n-gram drafter


def seq_req(tokens: Sequence[int], prompt_len: int | None = None) -> Request:
    """A request whose sequence (prompt + output) is ``tokens``."""
    n = len(tokens) if prompt_len is None else prompt_len
    r = Request("q", n, 64, prompt=list(tokens[:n]))
    r.output = list(tokens[n:])
    return r


def test_ngram_proposes_what_followed_the_last_tokens() -> None:
    assert NgramDrafter().propose(seq_req([1, 2, 3, 4, 1, 2]), 3) == [3, 4, 1]
    assert NgramDrafter().propose(seq_req([1, 2, 3, 4, 1, 2], prompt_len=3), 3) == [3, 4, 1]
    assert NgramDrafter().propose(seq_req([1, 2, 3, 4, 1, 2]), 1) == [3]


def test_ngram_without_a_match_proposes_nothing() -> None:
    assert NgramDrafter().propose(seq_req([1, 2, 3, 4]), 3) == []
    assert NgramDrafter().propose(seq_req([7]), 3) == []
    assert NgramDrafter(max_ngram=3, min_ngram=2).propose(seq_req([1, 2, 1]), 3) == []
    assert NgramDrafter().propose(seq_req([1, 2, 1]), 0) == ()


def test_ngram_tries_the_longest_ngram_first() -> None:
    # [5, 6] occurred at the start (then 7, 9); the last [6] alone most recently (then 8)
    tokens = [5, 6, 7, 9, 6, 8, 5, 6]
    assert NgramDrafter(max_ngram=3).propose(seq_req(tokens), 2) == [7, 9]
    assert NgramDrafter(max_ngram=1).propose(seq_req(tokens), 2) == [8, 5]


def test_ngram_takes_the_most_recent_occurrence_up_to_the_end() -> None:
    assert NgramDrafter().propose(seq_req([1, 2, 1, 3, 1]), 5) == [3, 1]
    assert NgramDrafter().propose(seq_req([4, 4, 4, 4]), 3) == [4]


def test_ngram_matches_whole_tokens_only() -> None:
    # 256 then 0 holds the bytes of the token 1 at an offset that is no token boundary
    assert NgramDrafter(max_ngram=1).propose(seq_req([256, 0, 0, 1]), 3) == []
    assert NgramDrafter(max_ngram=1).propose(seq_req([1, 7, 256, 0, 0, 1]), 3) == [7, 256, 0]
    assert NgramDrafter().propose(seq_req([-1, 2, -1]), 2) == [2, -1]


def test_ngram_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="min_ngram"):
        NgramDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match="min_ngram"):
        NgramDrafter(min_ngram=0)


def test_placeholder_drafter_always_proposes_k() -> None:
    assert PlaceholderDrafter().propose(seq_req([1]), 3) == (PLACEHOLDER_TOKEN,) * 3


# ---------------------------------------------------------------------------- plans and config


def test_plan_round_trips_with_drafts_and_reads_old_entries() -> None:
    plan = Plan(4, decode=(DecodeSlot("a", 9, (1, 2, 3), (5, 6)), DecodeSlot("b", 3, (7,))))
    d = plan.to_dict()
    assert d["decode"] == [["a", 9, [1, 2, 3], [5, 6]], ["b", 3, [7]]]
    assert Plan.from_dict(d) == plan
    assert (plan.num_draft_tokens, plan.num_decode_tokens) == (2, 4)
    old = {"step": 1, "prefill": [], "decode": [["b", 3, [7]]], "preempted": [], "aborted": []}
    assert Plan.from_dict(old).decode == (DecodeSlot("b", 3, (7,)),)


def test_num_draft_tokens_must_be_non_negative() -> None:
    assert SchedulerConfig().num_draft_tokens == 0
    with pytest.raises(ValueError, match="num_draft_tokens"):
        SchedulerConfig(num_draft_tokens=-1)


# ---------------------------------------------------------------------------- scheduling


def req(rid: str, n: int, out: int, base: int = 0, **kw: object) -> Request:
    return Request(rid, n, out, prompt=[base + i for i in range(n)], **kw)  # type: ignore[arg-type]


class Recording:
    """A drafter that proposes ``100, 101, ...`` and records the ``k`` it was asked for."""

    def __init__(self, limit: int | None = None) -> None:
        self.asked: list[tuple[str, int]] = []
        self.limit = limit

    def propose(self, req: Request, k: int) -> Sequence[int]:
        self.asked.append((req.rid, k))
        return [100 + i for i in range(min(k, self.limit if self.limit is not None else k))]


def spec(drafter: Drafter, k: int = 4, **kw: object) -> Scheduler:
    return Scheduler(SchedulerConfig(num_draft_tokens=k, **kw), drafter)  # type: ignore[arg-type]


def test_draft_is_limited_by_max_new_tokens_and_by_pages() -> None:
    drafter = Recording()
    s = spec(drafter, 8, num_pages=5, page_size=4, prefix_cache=False)
    s.add(req("a", 4, out=12))
    s.add(req("b", 11, out=2, base=50))
    s.complete(s.schedule(0.0), {"a": 1, "b": 1})  # a holds 1 page, b 3: one is free
    plan = s.schedule(1.0)
    slots = {d.rid: d for d in plan.decode}
    # a's position 4 takes the last free page; its drafts fit in that page: positions 5..7
    assert slots["a"].position == 4 and slots["a"].draft == (100, 101, 102)
    # b may output 2 tokens: the prefill's, then its slot's own; nothing is left for a draft
    assert slots["b"].draft == ()
    assert drafter.asked == [("a", 3)]
    assert s.stats().pages_free == 0
    check_invariants(s)


def test_drafts_take_evictable_cache_pages_never_referenced_ones() -> None:
    s = spec(PlaceholderDrafter(), 8, num_pages=8, page_size=2)
    s.add(req("x", 4, out=1, base=50))
    s.complete(s.schedule(0.0), {"x": 1})  # x's two prompt pages stay cached, unreferenced
    s.add(req("b", 5, out=3, base=60))
    s.add(req("a", 5, out=10))
    s.complete(s.schedule(1.0), {"a": 1, "b": 1})  # 3 pages each, their prefixes cached
    assert (s.memory.num_free, s.memory.evictable) == (0, 2)
    plan = s.schedule(2.0)
    # b may output one more token after its slot's own: x's pages are evicted for its page 3;
    # a gets the one page left over (positions 6, 7), never b's or its own cached prefix
    assert [(d.rid, d.position, len(d.draft)) for d in plan.decode] == [("b", 5, 1), ("a", 5, 2)]
    assert (s.memory.num_free, s.memory.evictable) == (0, 0)
    assert s.memory.cache is not None and s.memory.cache.cached_pages == 4
    check_invariants(s)


def test_rollback_frees_the_pages_past_the_verified_tokens() -> None:
    s = spec(PlaceholderDrafter(), 4, num_pages=8, page_size=2, prefix_cache=False)
    s.add(req("a", 4, out=10))
    s.complete(s.schedule(0.0), {"a": 1})
    assert s.stats().pages_free == 6
    plan = s.schedule(1.0)
    (slot,) = plan.decode
    assert (slot.position, len(slot.draft), len(slot.pages)) == (4, 4, 5)  # positions 4..8
    events = s.complete(plan, {"a": [7]})  # every draft token rejected
    assert events == [TokenOut("a", 7, False)]
    a = s.get("a")
    assert a is not None and (a.num_planned, len(a.pages), a.output) == (5, 3, [1, 7])
    assert s.stats().pages_free == 5
    check_invariants(s)
    plan = s.schedule(2.0)
    assert plan.decode[0].position == 5, "the next slot overwrites the first rejected position"
    draft = plan.decode[0].draft
    assert len(draft) == 4
    events = s.complete(plan, {"a": [*draft, 104]})  # every draft token accepted
    assert [e.token for e in events if isinstance(e, TokenOut)] == [*draft, 104]
    assert s.get("a").num_planned == 10  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="begin with"):
        s.complete(s.schedule(3.0), {"a": [5, 6]})


def test_a_stop_token_among_the_verified_ends_the_request_there() -> None:
    s = spec(Recording(), 4, num_pages=8, page_size=2, prefix_cache=False)
    s.add(req("a", 4, out=10, stop_token_ids=frozenset({101})))
    s.complete(s.schedule(0.0), {"a": 1})
    plan = s.schedule(1.0)
    assert plan.decode[0].draft == (100, 101, 102, 103)
    events = s.complete(plan, {"a": [100, 101, 7]})  # the model's 7 after the stop is dropped
    assert events == [
        TokenOut("a", 100, False),
        TokenOut("a", 101, False),
        Finished("a", FinishReason.STOP, 3),
    ]
    assert s.stats().pages_free == 8 and not s.has_work()


def test_the_output_limit_ends_a_request_mid_draft() -> None:
    s = spec(Recording(), 4, num_pages=8, page_size=2)
    s.add(req("a", 4, out=3))
    s.complete(s.schedule(0.0), {"a": 1})
    plan = s.schedule(1.0)
    assert plan.decode[0].draft == (100,), "two tokens left: the slot's own and one draft"
    events = s.complete(plan, {"a": [100, 5]})
    assert events[-1] == Finished("a", FinishReason.LENGTH, 3)
    stats = s.stats()
    assert stats.pages_free + stats.pages_cached == 8
    cache = s.memory.cache
    assert cache is not None  # cached: the prompt and the verified 1, 100 (position 5 is not)
    assert sorted(k for n in cache.nodes() for k in n.keys) == [(0, 1), (1, 100), (2, 3)]


def test_a_slot_with_drafts_sits_out_the_next_step_under_overlap() -> None:
    drafter = Recording()
    s = spec(drafter, 3, num_pages=16, page_size=4)
    s.add(req("a", 4, out=20))
    prefill = s.schedule(0.0)
    first = s.schedule(1.0)  # its input token is sampled by the prefill in flight
    assert drafter.asked == [("a", 4)], "one more is asked, its guess for that token dropped"
    assert [(d.position, d.draft) for d in first.decode] == [(4, (101, 102, 103))]
    s.complete(prefill, {"a": 1})
    idle = s.schedule(2.0)
    assert not idle.decode, "a's next position depends on what the step in flight accepts"
    check_invariants(s)
    assert s.complete(first, {"a": [101, 102, 9]}) == [
        TokenOut("a", 101, False),
        TokenOut("a", 102, False),
        TokenOut("a", 9, False),
    ]
    again = s.schedule(3.0)
    assert [(d.position, d.draft) for d in again.decode] == [(7, (100, 101, 102))]
    assert drafter.asked[-1] == ("a", 3)
    s.complete(idle, {})
    check_invariants(s)


def test_a_request_without_a_draft_keeps_its_pace_under_overlap() -> None:
    s = spec(Recording(limit=0), 3, num_pages=16, page_size=4)
    s.add(req("a", 4, out=20))
    plans = [s.schedule(0.0), s.schedule(1.0)]
    for step in range(2, 6):
        s.complete(plans[-2], {"a": step})
        plans.append(s.schedule(float(step)))
        assert [d.position for d in plans[-1].decode] == [step + 3]


def test_an_aborted_request_s_draft_slot_produces_nothing() -> None:
    s = spec(PlaceholderDrafter(), 2, num_pages=6, page_size=2, prefix_cache=False)
    s.add(req("a", 4, out=8))
    s.add(req("b", 4, out=8, base=50))
    s.complete(s.schedule(0.0), {"a": 1, "b": 1})
    drafted = s.schedule(1.0)
    assert all(d.draft for d in drafted.decode)
    s.abort("a")
    nxt = s.schedule(2.0)
    assert nxt.aborted == ("a",) and not nxt.decode
    assert s.complete(drafted, {"a": [3], "b": [3]}) == [TokenOut("b", 3, False)]
    assert s.complete(nxt, {}) == [Finished("a", FinishReason.ABORT, 1)]
    check_invariants(s)
    while s.has_work():
        s.complete(s.schedule(3.0), None)
    assert s.stats().pages_free == 6


def test_a_victim_with_drafts_in_flight_keeps_its_pages_until_they_complete() -> None:
    s = spec(PlaceholderDrafter(), 2, num_pages=8, page_size=2, prefix_cache=False)
    s.add(req("c", 3, out=4, base=90))
    s.add(req("a", 4, out=4))
    s.add(req("b", 4, out=4, base=50))
    s.complete(s.schedule(0.0), {"c": 1, "a": 1, "b": 1})  # 6 pages taken, 2 free
    drafted = s.schedule(1.0)  # a and b take the free pages; one draft token fits each
    assert [(d.rid, d.draft) for d in drafted.decode] == [("c", ()), ("a", (-1,)), ("b", (-1,))]
    nxt = s.schedule(2.0)  # c needs a page: b, the fcfs victim, is preempted; a sits out
    assert nxt.preempted == ("b",) and not nxt.decode
    assert s.stats().pages_free == 0, "the plan in flight still writes b's pages"
    check_invariants(s)
    events = s.complete(drafted, {"c": 7, "a": [-1, 9], "b": [-1, 9]})
    assert [(e.rid, e.token) for e in events if isinstance(e, TokenOut)] == [
        ("c", 7),
        ("a", -1),
        ("a", 9),
    ]
    assert s.stats().pages_free == 3
    check_invariants(s)
    assert s.complete(nxt, {}) == [Preempted("b")]
    while s.has_work():
        s.complete(s.schedule(3.0), None)
    assert s.stats().pages_free == 8


def test_verified_counts_outside_the_draft_are_rejected_before_anything_changes() -> None:
    s = spec(PlaceholderDrafter(), 2, num_pages=8, page_size=2)
    s.add(req("a", 4, out=8))
    s.complete(s.schedule(0.0), {"a": 1})
    plan = s.schedule(1.0)
    for tokens, accepted in [
        ({"a": [1, 2, 3, 4]}, None),
        ({"a": []}, None),
        (None, {"a": 3}),
        (None, {"a": -1}),
        (None, {"zz": 0}),
    ]:
        with pytest.raises(ValueError, match="draft tokens"):
            s.complete(plan, tokens, accepted=accepted)
    check_invariants(s)
    events = s.complete(plan, None, accepted={"a": 2})
    assert [e.token for e in events if isinstance(e, TokenOut)] == [PLACEHOLDER_TOKEN] * 3


class NoGuess:
    """A drafter that never has a guess: its slots carry no draft."""

    def propose(self, req: Request, k: int) -> Sequence[int]:
        return ()


def test_a_slot_without_a_draft_takes_one_token() -> None:
    """While speculating, a slot whose drafter had no guess takes an int; a sequence is an error
    (checked only while speculating: the plain path stays as cheap as before)."""
    s = Scheduler(SchedulerConfig(num_pages=8, page_size=2, num_draft_tokens=2), NoGuess())
    s.add(req("a", 4, out=3))
    s.complete(s.schedule(0.0), {"a": 1})
    plan = s.schedule(1.0)
    assert not plan.decode[0].draft
    with pytest.raises(ValueError, match="without draft tokens takes one token"):
        s.complete(plan, {"a": [2]})
    assert s.complete(plan, {"a": 2}) == [TokenOut("a", 2, False)]


def test_speculation_stops_decode_runs() -> None:
    for drafter, expected in ((None, True), (PlaceholderDrafter(), False)):
        s = Scheduler(SchedulerConfig(num_pages=16, page_size=4, num_draft_tokens=2), drafter)
        s.add(req("a", 4, out=12))
        s.complete(s.schedule(0.0), None)
        assert (s.decode_run_length(5) > 0) is expected


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize(
    ("num_draft_tokens", "drafter"),
    [(0, NgramDrafter()), (0, PlaceholderDrafter()), (3, None)],
)
def test_without_speculation_plans_are_todays(
    monkeypatch: pytest.MonkeyPatch, overlap: bool, num_draft_tokens: int, drafter: Drafter | None
) -> None:
    config = SchedulerConfig(num_pages=14, page_size=4, max_running=6, max_prefill_tokens=24)
    today, _ = run_workload(config, 3, steps=200, overlap=overlap)
    monkeypatch.setattr(tier_workload, "Scheduler", lambda c: Scheduler(c, drafter))
    config = replace(config, num_draft_tokens=num_draft_tokens)
    plans, _ = run_workload(config, 3, steps=200, overlap=overlap)
    assert plans == today
