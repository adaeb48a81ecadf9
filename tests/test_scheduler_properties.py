"""Property tests of the scheduler core: random add / abort / schedule / complete / fast-forward
sequences, in strict alternation and with overlap scheduling (one plan in flight).

Sampled tokens are a function of (request, output index), as if the model were
deterministic, so a request's output does not depend on how it was scheduled:
the overlapped run must deliver exactly what a strictly alternated run of the
same requests delivers.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from core.scheduler import (
    POLICIES,
    Event,
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
from core.scheduler.invariants import check_invariants, page_owners

VOCAB = 6  # few distinct tokens, so prompts share prefixes
STOP_TOKEN = 5
PREFIXES = [[1, 2, 3, 4, 1, 2, 3, 4], [2, 2, 2, 2, 2, 2], [0, 1, 0, 1]]


def sampled_token(seed: int, rid: str, index: int) -> int:
    """The token a deterministic model samples as ``rid``'s output number ``index``."""
    return zlib.crc32(f"{seed}:{rid}:{index}".encode()) % VOCAB


def sampled(plan: Plan, prompt_len: Callable[[str], int], seed: int) -> dict[str, int]:
    """Tokens for ``plan``'s sampling slots; the output index follows from the position."""
    tokens = {}
    for c in plan.prefill:
        if c.samples:
            tokens[c.rid] = sampled_token(seed, c.rid, c.start + c.length - prompt_len(c.rid))
    for d in plan.decode:
        tokens[d.rid] = sampled_token(seed, d.rid, d.position + 1 - prompt_len(d.rid))
    return tokens


@dataclass
class Tracked:
    req: Request
    limit: int
    ends: int = 0
    outputs: int = 0
    reason: FinishReason | None = None
    aborted_at_step: int | None = None
    fast_forwarded: bool = False


SETUP = {  # the machine's configuration, drawn once per run
    "num_pages": st.integers(4, 48),
    "page_size": st.sampled_from([1, 2, 4]),
    "budget": st.integers(1, 24),
    "max_running": st.integers(1, 8),
    "policy": st.sampled_from(sorted(POLICIES)),
    "prefix_cache": st.booleans(),
    "reserve": st.booleans(),
    "overlap": st.booleans(),
    "seed": st.integers(0, 3),
    "host_pages": st.sampled_from([0, 0, 4, 16]),
    "write_through": st.booleans(),
}


class SchedulerMachine(RuleBasedStateMachine):
    """Drives a scheduler and an identically fed twin; checks invariants after every call.

    With ``overlap`` a plan may be scheduled while another is in flight (two
    outstanding at most, completed oldest first), as the engine's loop does.
    """

    @initialize(**SETUP)
    def setup(
        self,
        num_pages: int,
        page_size: int,
        budget: int,
        max_running: int,
        policy: str,
        prefix_cache: bool,
        reserve: bool,
        overlap: bool,
        seed: int,
        host_pages: int,
        write_through: bool,
    ) -> None:
        self.config = SchedulerConfig(
            num_pages=num_pages,
            page_size=page_size,
            max_running=max_running,
            max_prefill_tokens=budget,
            policy=policy,
            prefix_cache=prefix_cache,
            reserve_decode=reserve,
            new_token_ratio_decay_steps=8,
            host_kv_pages=host_pages,
            host_kv_policy="write_through" if write_through else "write_back",
        )
        self.overlap = overlap
        self.seed = seed
        self.s = Scheduler(self.config)
        self.twin = Scheduler(self.config)
        self.now = 0.0
        self.n = 0
        self.tracked: dict[str, Tracked] = {}
        self.outstanding: list[Plan] = []
        event("overlap" if overlap else "strict")

    # ------------------------------------------------------------------ rules
    @rule(
        prefix=st.sampled_from(range(len(PREFIXES))),
        suffix=st.lists(st.integers(0, VOCAB - 1), max_size=10),
        max_new=st.integers(1, 12),
        priority=st.integers(0, 3),
        stop=st.booleans(),
    )
    def add(self, prefix: int, suffix: list[int], max_new: int, priority: int, stop: bool) -> None:
        self.now += 0.5
        prompt = PREFIXES[prefix] + suffix
        req = Request(
            rid=f"r{self.n}",
            prompt_len=len(prompt),
            prompt=prompt,
            max_new_tokens=max_new,
            arrival=self.now,
            priority=priority,
            expected_output_len=max_new,
            stop_token_ids=frozenset({STOP_TOKEN}) if stop else frozenset(),
        )
        self.n += 1
        try:
            self.s.add(req)
        except RequestRejected:
            assert -(-(len(prompt) + max_new) // self.config.page_size) > self.config.num_pages
            try:
                self.twin.add(fresh(req))
            except RequestRejected:
                return
            raise AssertionError("twin accepted what the scheduler rejected") from None
        self.twin.add(fresh(req))
        self.tracked[req.rid] = Tracked(req, limit=max_new)

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

    @precondition(lambda self: len(self.outstanding) < (2 if self.overlap else 1))
    @rule()
    def schedule(self) -> None:
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
            ("scheduled in flight", self.outstanding),
        ):
            if happened:
                event(name)
        self.outstanding.append(plan)

    @precondition(lambda self: bool(self.outstanding))
    @rule()
    def complete(self) -> None:
        plan = self.outstanding.pop(0)
        tokens = sampled(plan, lambda rid: self.tracked[rid].req.prompt_len, self.seed)
        events = self.s.complete(plan, tokens)
        assert events == self.twin.complete(plan, tokens)
        self._track(plan, events)

    @rule(n=st.integers(1, 8))
    def engine_loop(self, n: int) -> None:
        """``n`` iterations of the engine's loop (the pattern that makes decode runs)."""
        for _ in range(n):
            if not self.s.has_work():
                return
            self._iterate()

    @rule(max_steps=st.integers(1, 6))
    def fast_forward(self, max_steps: int) -> None:
        """advance_decode(k) has the same effect as k single steps without tokens (in overlap:
        k times schedule, then complete the plan before)."""
        k = self.s.decode_run_length(max_steps)
        event(f"fast-forward k={min(k, 2)}{' in flight' if self.outstanding else ''}")
        if k == 0:
            return
        assert len(self.outstanding) <= 1
        reference = copy.deepcopy(self.s)
        pending = list(self.outstanding)
        blocked = set()
        for _ in range(k):
            plan = reference.schedule(self.now)
            assert not plan.prefill and not plan.preempted and not plan.aborted
            assert not plan.has_copies, "a decode run carries no host tier copies"
            blocked.add(plan.blocked)
            pending.append(plan)
            events = reference.complete(pending.pop(0), None)
            assert not any(isinstance(e, Finished) for e in events)
        run = self.s.advance_decode(k)
        assert run == self.twin.advance_decode(k)
        assert run.k == k
        assert blocked == {run.blocked}, "a run reports the same admission block as its steps"
        assert _state(self.s) == _state(reference)
        assert ([run.in_flight] if run.in_flight else []) == pending, "the same plan in flight"
        self.outstanding = pending
        for rid in run.rids:
            self.tracked[rid].outputs += k
            self.tracked[rid].fast_forwarded = True

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
        in_flight = set(self.outstanding[-1].sampling_rids()) if self.outstanding else set()
        for c in plan.prefill:
            t = self.tracked[c.rid]
            assert c.length > 0
            assert len(c.pages) * cfg.page_size >= c.start + c.length
            assert c.start + c.length <= t.req.prompt_len + t.outputs, "prefill of unknown tokens"
        for d in plan.decode:
            t = self.tracked[d.rid]
            assert len(d.pages) * cfg.page_size > d.position
            known = t.req.prompt_len + t.outputs
            # the input token is known, or the plan in flight samples it
            assert d.position < known or (d.position == known and d.rid in in_flight), (
                f"{d.rid} decodes position {d.position} with {known} tokens known"
            )
        for rid in plan.aborted:
            assert self.s.get(rid) is None
            assert rid not in self.s.running
        admitted = [rid for rid in rids if rid in waiting_before]
        if cfg.policy == "fcfs" and admitted:
            # no request waits behind a later arrival
            still_waiting = [k for rid, k in waiting_before.items() if rid not in admitted]
            if still_waiting:
                assert max(waiting_before[r] for r in admitted) < min(still_waiting)

    def _track(self, plan: Plan, events: list[Event]) -> None:
        for e in events:
            t = self.tracked[e.rid]
            if isinstance(e, TokenOut):
                assert t.ends == 0, f"token for {e.rid} after it ended"
                t.outputs += 1
                assert t.outputs <= t.limit, f"{e.rid} got more tokens than its limit"
            elif isinstance(e, Finished):
                t.ends += 1
                assert t.ends == 1, f"{e.rid} ended twice"
                t.reason = e.reason
                if e.reason is FinishReason.ABORT:
                    assert t.aborted_at_step == plan.step
                else:
                    assert t.aborted_at_step is None
                    if e.reason is FinishReason.LENGTH:
                        assert t.outputs == t.limit
        for rid in plan.aborted:
            assert self.tracked[rid].ends == 1

    @invariant()
    def core_invariants(self) -> None:
        if not hasattr(self, "s"):
            return
        check_invariants(self.s)
        for rid, t in self.tracked.items():
            if t.aborted_at_step is not None and t.aborted_at_step <= self.s.step:
                assert not t.req.pages, f"aborted {rid} still holds pages"
        owners = page_owners(self.s)
        for plan in self.outstanding:  # what a plan in flight reads or writes is not reused
            for rid, pages in [(c.rid, c.pages) for c in plan.prefill] + [
                (d.rid, d.pages) for d in plan.decode
            ]:
                for page in pages:
                    assert owners[page] in (rid, "cache", "held"), (
                        f"page {page} of {rid} in step {plan.step} (in flight) is {owners[page]}"
                    )

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        self._drain()
        assert not self.s.has_work(), "requests never finished"
        for rid, t in self.tracked.items():
            assert t.ends == 1, f"{rid} ended {t.ends} times"
            assert t.req.status in (RequestStatus.FINISHED, RequestStatus.ABORTED)
        stats = self.s.stats()
        assert stats.pages_free + stats.pages_cached == stats.num_pages, "pages leaked"
        check_invariants(self.s)
        if self.overlap:
            self._compare_with_strict()

    def _drain(self) -> None:
        """Run the engine's loop until the scheduler is idle."""
        for _ in range(2000):
            if not self.s.has_work():
                return
            self._iterate()
            self.core_invariants()

    def _iterate(self) -> None:
        """One iteration of the engine's loop: schedule, complete the plan in flight (strict:
        the new plan), complete an empty plan at once."""
        while len(self.outstanding) >= (2 if self.overlap else 1):
            self.complete()
        self.schedule()
        plan = self.outstanding[-1]
        if len(self.outstanding) == 2:
            self.complete()
        if not self.overlap or not plan.has_model_work:
            self.complete()

    def _compare_with_strict(self) -> None:
        """The requests never aborted end as they do in strict alternation, with the same
        tokens (unless fast-forwarded: those got placeholders)."""
        kept = {rid: t for rid, t in self.tracked.items() if t.aborted_at_step is None}
        strict = Scheduler(self.config)
        for t in kept.values():
            strict.add(fresh(t.req))
        ended: dict[str, tuple[int, FinishReason]] = {}
        for _ in range(4000):
            if not strict.has_work():
                break
            plan = strict.schedule(self.now)
            tokens = sampled(plan, lambda rid: kept[rid].req.prompt_len, self.seed)
            for e in strict.complete(plan, tokens):
                if isinstance(e, Finished):
                    ended[e.rid] = (e.num_output_tokens, e.reason)
        for rid, t in kept.items():
            if t.fast_forwarded and t.req.stop_token_ids:
                continue
            assert ended[rid] == (t.outputs, t.reason), f"{rid}: strict {ended[rid]}"


def fresh(r: Request) -> Request:
    """A new request with ``r``'s parameters and none of its state."""
    return Request(
        rid=r.rid,
        prompt_len=r.prompt_len,
        prompt=list(r.prompt),
        max_new_tokens=r.max_new_tokens,
        arrival=r.arrival,
        priority=r.priority,
        expected_output_len=r.expected_output_len,
        stop_token_ids=r.stop_token_ids,
    )


def _state(s: Scheduler) -> object:
    reqs = {
        rid: (r.status, r.pages, r.num_planned, tuple(r.output), r.num_shared_pages, r.last_plan)
        for rid, r in s.requests.items()
    }
    cache = s.memory.cache
    nodes = []
    if cache is not None:
        nodes = sorted((tuple(n.pages), tuple(n.host), n.ref, n.last_access) for n in cache.nodes())
    flight = (s.in_flight.plans(), s.in_flight.completed)
    return (reqs, s.memory.allocator.free_pages(), nodes, s.step, s.stats(), flight,
            s.reservation.steps)  # fmt: skip


def machine_settings(max_examples: int, steps: int) -> settings:
    """A state machine's Hypothesis budget: runs, and calls a run."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


SchedulerMachine.TestCase.settings = machine_settings(300, 60)
TestSchedulerMachine = SchedulerMachine.TestCase
