"""Property tests of the scheduler core: random add / abort / schedule / complete sequences."""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from engine.scheduler import (
    POLICIES,
    Finished,
    FinishReason,
    Plan,
    Request,
    RequestRejected,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    TokenOut,
)
from engine.scheduler.invariants import check_invariants

VOCAB = 6  # few distinct tokens, so prompts share prefixes
STOP_TOKEN = 5
PREFIXES = [[1, 2, 3, 4, 1, 2, 3, 4], [2, 2, 2, 2, 2, 2], [0, 1, 0, 1]]


@dataclass
class Tracked:
    req: Request
    ends: int = 0
    outputs: int = 0
    admitted_first: bool = False
    limit: int = 0
    ended_at_step: int | None = None
    aborted_at_step: int | None = None
    events: list[object] = field(default_factory=list)


class SchedulerMachine(RuleBasedStateMachine):
    """Drives a scheduler and an identically fed twin; checks invariants after every call."""

    @initialize(
        num_pages=st.integers(4, 48),
        page_size=st.sampled_from([1, 2, 4]),
        budget=st.integers(1, 24),
        max_running=st.integers(1, 8),
        policy=st.sampled_from(sorted(POLICIES)),
        prefix_cache=st.booleans(),
    )
    def setup(
        self,
        num_pages: int,
        page_size: int,
        budget: int,
        max_running: int,
        policy: str,
        prefix_cache: bool,
    ) -> None:
        self.config = SchedulerConfig(
            num_pages=num_pages,
            page_size=page_size,
            max_running=max_running,
            max_prefill_tokens=budget,
            policy=policy,
            prefix_cache=prefix_cache,
        )
        self.s = Scheduler(self.config)
        self.twin = Scheduler(self.config)
        self.now = 0.0
        self.n = 0
        self.tracked: dict[str, Tracked] = {}
        self.last_plan: Plan | None = None

    # ------------------------------------------------------------------ rules
    @rule(
        prefix=st.sampled_from(range(len(PREFIXES))),
        suffix=st.lists(st.integers(0, VOCAB - 1), max_size=10),
        max_new=st.integers(1, 12),
        priority=st.integers(0, 3),
        stop=st.booleans(),
    )
    def add(self, prefix: int, suffix: list[int], max_new: int, priority: int, stop: bool) -> None:
        prompt = PREFIXES[prefix] + suffix
        self.now += 0.5
        rid = f"r{self.n}"
        self.n += 1

        def make() -> Request:
            return Request(
                rid=rid,
                prompt_len=len(prompt),
                prompt=list(prompt),
                max_new_tokens=max_new,
                arrival=self.now,
                priority=priority,
                expected_output_len=max_new,
                stop_token_ids=frozenset({STOP_TOKEN}) if stop else frozenset(),
            )

        req = make()
        try:
            self.s.add(req)
        except RequestRejected:
            need = -(-(len(prompt) + max_new) // self.config.page_size)
            assert need > self.config.num_pages
            try:
                self.twin.add(make())
            except RequestRejected:
                return
            raise AssertionError("twin accepted what the scheduler rejected") from None
        self.twin.add(make())
        self.tracked[rid] = Tracked(req, limit=max_new)

    @precondition(lambda self: bool(self.tracked))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.tracked)))
        t = self.tracked[rid]
        live = t.ends == 0 and t.aborted_at_step is None
        assert self.s.abort(rid) == live
        assert self.twin.abort(rid) == live
        if live:
            t.aborted_at_step = self.s.step + 1  # released by the next schedule()

    @rule(tokens=st.lists(st.integers(0, VOCAB - 1), min_size=16, max_size=16))
    def step(self, tokens: list[int]) -> None:
        self.now += 0.25
        waiting_before = {
            r.rid: (r.arrival, r.seq)
            for r in self.s.waiting()
            if r.status is not RequestStatus.ABORTED
        }
        plan = self.s.schedule(self.now)
        assert plan == self.twin.schedule(self.now), "identical calls gave different plans"
        self._check_plan(plan, waiting_before)
        for name, happened in (
            ("preempted", plan.preempted),
            ("blocked " + plan.blocked, plan.blocked),
            ("chunked", any(not c.samples for c in plan.prefill)),
        ):
            if happened:
                event(name)
        sampled = {rid: tokens[i % len(tokens)] for i, rid in enumerate(plan.sampling_rids())}
        events = self.s.complete(plan, sampled)
        assert events == self.twin.complete(plan, sampled)
        self._track(plan, events)
        self.last_plan = plan

    @rule(max_steps=st.integers(1, 6))
    def fast_forward(self, max_steps: int) -> None:
        """advance_decode(k) has the same effect as k single steps without tokens."""
        k = self.s.decode_run_length(max_steps)
        event(f"fast-forward k={min(k, 2)}")
        if k == 0:
            return
        reference = copy.deepcopy(self.s)
        blocked = set()
        for _ in range(k):
            plan = reference.schedule(self.now)
            assert not plan.prefill and not plan.preempted and not plan.aborted
            blocked.add(plan.blocked)
            events = reference.complete(plan, None)
            assert not any(isinstance(e, Finished) for e in events)
        run = self.s.advance_decode(k, self.now)
        assert run == self.twin.advance_decode(k, self.now)
        assert run.k == k
        assert blocked == {run.blocked}, "a run reports the same admission block as its steps"
        assert _state(self.s) == _state(reference)
        for rid in run.rids:
            self.tracked[rid].outputs += k

    # ------------------------------------------------------------------ checks
    def _check_plan(self, plan: Plan, waiting_before: dict[str, tuple[float, int]]) -> None:
        cfg = self.config
        assert plan.num_prefill_tokens <= cfg.max_prefill_tokens
        rids = [c.rid for c in plan.prefill] + [d.rid for d in plan.decode]
        assert len(rids) == len(set(rids)), "a request appears twice in one plan"
        assert len(rids) <= cfg.max_running
        assert len(self.s.running) <= cfg.max_running
        for rid in rids:
            t = self.tracked[rid]
            assert t.ends == 0, f"{rid} scheduled after it ended"
            assert t.aborted_at_step is None or t.aborted_at_step > plan.step
        for c in plan.prefill:
            assert c.length > 0
            assert len(c.pages) * cfg.page_size >= c.start + c.length
        for d in plan.decode:
            assert len(d.pages) * cfg.page_size > d.position
        for rid in plan.aborted:
            assert self.s.get(rid) is None
            assert rid not in self.s.running
        admitted = [rid for rid in rids if rid in waiting_before]
        if cfg.policy == "fcfs" and admitted:
            # no request waits behind a later arrival
            still_waiting = [k for rid, k in waiting_before.items() if rid not in admitted]
            if still_waiting:
                assert max(waiting_before[r] for r in admitted) < min(still_waiting)

    def _track(self, plan: Plan, events: list[object]) -> None:
        for e in events:
            if isinstance(e, TokenOut):
                t = self.tracked[e.rid]
                assert t.ends == 0, f"token for {e.rid} after it ended"
                t.outputs += 1
                assert t.outputs <= t.limit, f"{e.rid} got more tokens than its limit"
            elif isinstance(e, Finished):
                t = self.tracked[e.rid]
                t.ends += 1
                assert t.ends == 1, f"{e.rid} ended twice"
                if e.reason is FinishReason.ABORT:
                    assert t.aborted_at_step == plan.step
                else:
                    assert t.aborted_at_step is None
                    if e.reason is FinishReason.LENGTH:
                        assert t.outputs == t.limit
                t.ended_at_step = plan.step
        for rid in plan.aborted:
            assert self.tracked[rid].ends == 1

    @invariant()
    def core_invariants(self) -> None:
        if hasattr(self, "s"):
            check_invariants(self.s)
            for rid, t in self.tracked.items():
                if t.aborted_at_step is not None and t.aborted_at_step <= self.s.step:
                    req = t.req
                    assert not req.pages, f"aborted {rid} still holds pages"

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        for _ in range(2000):
            if not self.s.has_work():
                break
            self.step([1] * 16)
        assert not self.s.has_work(), "requests never finished"
        for rid, t in self.tracked.items():
            assert t.ends == 1, f"{rid} ended {t.ends} times"
            assert t.req.status in (RequestStatus.FINISHED, RequestStatus.ABORTED)
        stats = self.s.stats()
        assert stats.pages_free + stats.pages_cached == stats.num_pages, "pages leaked"
        check_invariants(self.s)


def _state(s: Scheduler) -> object:
    reqs = {
        rid: (r.status, tuple(r.pages), r.num_computed, tuple(r.output), r.num_shared_pages)
        for rid, r in s.requests.items()
    }
    cache = (
        sorted((tuple(n.pages), n.ref, n.last_access) for n in s.cache.nodes()) if s.cache else []
    )
    return (reqs, s.allocator.free_pages(), cache, s.step, s.stats())


SchedulerMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSchedulerMachine = SchedulerMachine.TestCase


def test_core_imports_no_torch_or_zmq() -> None:
    import subprocess

    code = (
        "import sys; import engine.scheduler, engine.scheduler.invariants; "
        "bad = [m for m in ('torch', 'zmq', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
