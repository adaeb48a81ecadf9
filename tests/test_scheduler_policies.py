"""Focused tests of scheduling decisions: policies, prefix hits, preemption, rejection."""

from __future__ import annotations

import subprocess
import sys

import pytest

from core.scheduler import (
    Blocked,
    Finished,
    FinishReason,
    Preempted,
    Request,
    RequestRejected,
    Scheduler,
    SchedulerConfig,
    get_policy,
)


def req(rid: str, n: int, out: int = 4, t: float = 0.0, base: int = 0, **kw: object) -> Request:
    return Request(
        rid=rid,
        prompt_len=n,
        prompt=[base + i for i in range(n)],
        max_new_tokens=out,
        arrival=t,
        **kw,  # type: ignore[arg-type]
    )


def run_until_idle(s: Scheduler, now: float = 0.0) -> list[object]:
    events: list[object] = []
    while s.has_work():
        plan = s.schedule(now)
        events += s.complete(plan, {r: 7 for r in plan.sampling_rids()})
        now += 1
    return events


def admission_order(policy: str, reqs: list[Request]) -> list[str]:
    s = Scheduler(SchedulerConfig(num_pages=256, page_size=4, max_running=1, policy=policy))
    for r in reqs:
        s.add(r)
    order: list[str] = []
    while s.has_work():
        plan = s.schedule(0.0)
        order += [c.rid for c in plan.prefill if c.start == 0]
        s.complete(plan, {r: 7 for r in plan.sampling_rids()})
    return order


def test_policies_order_admission() -> None:
    reqs = lambda: [  # noqa: E731
        req("late-short", 8, out=1, t=2.0, priority=1, expected_output_len=1, base=100),
        req("early-long", 8, out=9, t=0.0, priority=2, expected_output_len=9, base=200),
        req("mid-urgent", 8, out=5, t=1.0, priority=0, expected_output_len=5, base=300),
    ]
    assert admission_order("fcfs", reqs()) == ["early-long", "mid-urgent", "late-short"]
    assert admission_order("priority", reqs()) == ["mid-urgent", "late-short", "early-long"]
    assert admission_order("sjf", reqs()) == ["late-short", "mid-urgent", "early-long"]


def test_lpm_prefers_the_cached_prefix() -> None:
    s = Scheduler(SchedulerConfig(num_pages=64, page_size=4, max_running=1, policy="lpm"))
    s.add(req("warm", 16, out=1))
    run_until_idle(s)
    s.add(req("cold", 16, out=1, t=1.0, base=100))
    s.add(req("hit", 16, out=1, t=2.0))  # same prompt as "warm"
    plan = s.schedule(3.0)
    assert [c.rid for c in plan.prefill] == ["hit"]
    assert plan.prefill[0].start == 12  # 3 of 4 pages cached; the last page is recomputed


def test_prefix_hit_skips_cached_pages_and_counts_hit_rate() -> None:
    s = Scheduler(SchedulerConfig(num_pages=64, page_size=4))
    s.add(req("a", 10, out=3))
    run_until_idle(s)
    s.add(req("b", 10, out=3))
    plan = s.schedule(0.0)
    (chunk,) = plan.prefill
    # a's sequence is prompt(10) + 3 outputs; its KV holds 12 tokens = 3 full pages, but b
    # may reuse only the pages inside its own prompt: 2 full pages
    assert chunk.start == 8 and chunk.length == 2
    assert s.stats().cached_tokens == 8 and s.stats().prompt_tokens == 20


def test_hash_mode_shares_blocks_by_hash_id() -> None:
    s = Scheduler(SchedulerConfig(num_pages=512, page_size=16))
    s.add(Request("a", prompt_len=1100, block_hashes=[1, 2, 3], max_new_tokens=2))
    run_until_idle(s)
    s.add(Request("b", prompt_len=1300, block_hashes=[1, 2, 9], max_new_tokens=2))
    plan = s.schedule(0.0)
    assert plan.prefill[0].start == 1024  # blocks 1 and 2 (512 tokens each) were cached


def test_preemption_recomputes_the_policy_victim() -> None:
    # 6 pages of 4 tokens: two requests of 8 prompt tokens fill 4 pages and must grow
    s = Scheduler(SchedulerConfig(num_pages=6, page_size=4, prefix_cache=False))
    s.add(req("old", 8, out=12, t=0.0))
    s.add(req("new", 8, out=12, t=1.0, base=50))
    events = run_until_idle(s)
    preempted = [e.rid for e in events if isinstance(e, Preempted)]
    assert preempted and set(preempted) == {"new"}, "fcfs preempts the latest arrival"
    done = {e.rid: e for e in events if isinstance(e, Finished)}
    assert done["old"].reason is FinishReason.LENGTH and done["old"].num_output_tokens == 12
    assert done["new"].num_output_tokens == 12
    assert s.stats().pages_free == 6


def test_blocked_reasons() -> None:
    s = Scheduler(SchedulerConfig(num_pages=8, page_size=4, max_running=1))
    s.add(req("a", 4))
    s.add(req("b", 4, t=1.0))
    assert s.schedule(0.0).blocked == Blocked.RUNNING_CAP
    s2 = Scheduler(SchedulerConfig(num_pages=4, page_size=4))
    s2.add(req("a", 12, out=4))
    s2.add(req("b", 8, out=2, t=1.0))
    assert s2.schedule(0.0).blocked == Blocked.KV_MEMORY


def test_stop_token_and_abort() -> None:
    s = Scheduler(SchedulerConfig(num_pages=16, page_size=4))
    s.add(req("stop", 4, out=10, stop_token_ids=frozenset({7})))
    s.add(req("gone", 4, out=10, base=20))
    plan = s.schedule(0.0)
    assert s.abort("gone") and not s.abort("gone")
    events = s.complete(plan, {"stop": 7, "gone": 3})
    assert Finished("stop", FinishReason.STOP, 1) in events
    assert all(e.rid != "gone" for e in events), "an aborted request's token is discarded"
    plan = s.schedule(1.0)
    assert plan.aborted == ("gone",) and not plan.has_model_work
    assert s.complete(plan, {}) == [Finished("gone", FinishReason.ABORT, 0)]
    assert s.stats().pages_free + s.stats().pages_cached == 16


def test_rejects_requests_that_can_never_fit() -> None:
    s = Scheduler(SchedulerConfig(num_pages=4, page_size=4))
    with pytest.raises(RequestRejected, match="needs 5 KV pages"):
        s.add(req("big", 16, out=4))
    s.add(req("ok", 4))
    with pytest.raises(RequestRejected, match="duplicate"):
        s.add(req("ok", 4))
    with pytest.raises(RequestRejected, match="max_new_tokens"):
        s.add(req("zero", 4, out=0))
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        get_policy("nope")
    with pytest.raises(ValueError, match="num_pages"):
        SchedulerConfig(num_pages=0)


def test_plan_round_trips_through_a_dict() -> None:
    from core.scheduler import Plan

    s = Scheduler(SchedulerConfig(num_pages=16, page_size=4, max_prefill_tokens=3))
    s.add(req("a", 5))
    plan = s.schedule(0.5)
    assert Plan.from_dict(plan.to_dict()) == plan


def test_decode_run_goes_on_while_the_queue_head_lacks_memory() -> None:
    s = Scheduler(SchedulerConfig(num_pages=10, page_size=4, prefix_cache=False))
    s.add(req("a", 16, out=9))
    plan = s.schedule(0.0)
    s.complete(plan, None)
    s.add(req("big", 28, out=4, t=1.0, base=40))  # needs 7 pages to start; 6 are free
    assert s.decode_run_length(100) == 7  # a's last token is a normal step
    run = s.advance_decode(7)
    assert run.new_pages == (1, 0, 0, 0, 1, 0, 0) and run.blocked == Blocked.KV_MEMORY
    plan = s.schedule(2.0)
    assert [d.rid for d in plan.decode] == ["a"] and plan.blocked == Blocked.KV_MEMORY
    events = s.complete(plan, None)
    assert Finished("a", FinishReason.LENGTH, 9) in events
    assert [c.rid for c in s.schedule(3.0).prefill] == ["big"]


def test_running_requests_share_a_prefix_once_it_is_computed() -> None:
    s = Scheduler(SchedulerConfig(num_pages=64, page_size=4))
    s.add(req("a", 12, out=8))
    s.complete(s.schedule(0.0), None)  # a's prompt is computed; a is decoding
    s.add(req("b", 12, out=8, t=1.0))
    plan = s.schedule(1.0)
    (chunk,) = plan.prefill
    assert chunk.rid == "b" and chunk.start == 8  # 2 of a's 3 prompt pages, while a runs
    assert plan.decode[0].pages[:2] == chunk.pages[:2]


def test_duplicate_prefix_pages_computed_together_are_freed() -> None:
    s = Scheduler(SchedulerConfig(num_pages=64, page_size=4))
    s.add(req("a", 12, out=8))
    s.add(req("b", 12, out=8))
    plan = s.schedule(0.0)  # both compute the same 3 pages in one step
    assert [c.start for c in plan.prefill] == [0, 0]
    used = s.stats().pages_used
    s.complete(plan, None)
    a, b = s.get("a"), s.get("b")
    assert a is not None and b is not None
    assert a.pages[:3] == b.pages[:3], "b switched to the cached copy of the prefix"
    assert s.stats().pages_used == used - 3


def test_core_imports_no_torch_or_zmq() -> None:
    code = (
        "import sys; import core.scheduler, core.scheduler.invariants; "
        "bad = [m for m in ('torch', 'zmq', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
