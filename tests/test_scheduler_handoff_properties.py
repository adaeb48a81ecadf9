"""Property tests of prefill/decode disaggregation: a prefill-role and a decode-role scheduler
side by side, with the transfers between them.

Random adds, steps (strict or overlapped, on each side), hand-offs, transfers,
acknowledgments, failures and aborts at any point; both cores' invariants are checked
after every rule. Each side executes its plans on a model of its KV content
(``tier_workload.KVContent``) and a transfer copies the prefill side's pages into the
decode side's, so a page moved to the wrong place, or reused while a transfer still
needs it, is read later as the wrong token. Sampled tokens are a function of (request,
output index): a request that is not aborted ends with the tokens a colocated
scheduler gives it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_scheduler_properties import (
    PREFIXES,
    SETUP,
    STOP_TOKEN,
    VOCAB,
    machine_settings,
    sampled,
    sampled_token,
)
from tier_workload import KVContent

from core.scheduler import (
    Event,
    Finished,
    FinishReason,
    Plan,
    Preempted,
    Receive,
    Request,
    RequestRejected,
    Scheduler,
    SchedulerConfig,
    TokenOut,
    Transfer,
)
from core.scheduler.invariants import check_invariants
from core.scheduler.pages import pages_for


@dataclass
class Tracked:
    """A request as its client sees it, across both instances."""

    prompt: list[int]
    limit: int
    stop: bool
    p: str = "live"  # on the prefill side: live | aborting | held | gone
    d: str = "none"  # on the decode side: none | live | aborting | gone
    landed: bool = False
    aborted: bool = False
    delivered: list[int] = field(default_factory=list)
    reason: FinishReason | None = None  # how it ended for the client

    def request(self, rid: str) -> Request:
        return Request(
            rid,
            prompt_len=len(self.prompt),
            prompt=list(self.prompt),
            max_new_tokens=self.limit,
            stop_token_ids=frozenset({STOP_TOKEN}) if self.stop else frozenset(),
        )


SHARED = {  # the settings both sides share: field -> its strategy in the colocated machine's SETUP
    "page_size": "page_size",
    "max_running": "max_running",
    "max_prefill_tokens": "budget",
    "policy": "policy",
    "reserve_decode": "reserve",
    "host_kv_pages": "host_pages",
}


def unsent(t: Tracked) -> bool:
    return t.p == "held" and t.d == "none"


def landed_and_held(t: Tracked) -> bool:
    return t.p == "held" and t.landed


def in_transfer(t: Tracked) -> bool:
    return t.p == "held" and not t.landed


def not_ended(t: Tracked) -> bool:
    return t.reason is None


class Side:
    """One instance: its scheduler, its plans in flight and its KV content."""

    def __init__(self, config: SchedulerConfig, overlap: bool, machine: HandoffMachine) -> None:
        self.s = Scheduler(config)
        self.overlap = overlap
        self.m = machine
        self.kv = KVContent(config.page_size, machine.token_of)
        self.outstanding: list[Plan] = []

    def can_schedule(self) -> bool:
        return len(self.outstanding) < (2 if self.overlap else 1)

    def schedule(self) -> Plan:
        plan = self.s.schedule(0.0)
        self.kv.apply(plan)  # reads are checked: each position holds its token
        self.outstanding.append(plan)
        return plan

    def complete(self) -> list[Event]:
        plan = self.outstanding.pop(0)
        tokens = sampled(plan, lambda rid: len(self.m.tracked[rid].prompt), self.m.seed)
        return self.s.complete(plan, tokens)

    def iterate(self) -> None:
        """One iteration of the engine's loop (as ``SchedulerMachine._iterate``)."""
        while not self.can_schedule():
            self.m.completed(self)
        self.m.scheduled(self)
        plan = self.outstanding[-1]
        if len(self.outstanding) == 2:
            self.m.completed(self)
        if not self.overlap or not plan.has_model_work:
            self.m.completed(self)


class HandoffMachine(RuleBasedStateMachine):
    @initialize(
        shared=st.fixed_dictionaries({f: SETUP[name] for f, name in SHARED.items()}),
        kv_tokens=st.tuples(st.integers(12, 64), st.integers(12, 64)),  # each side's pool
        prefix_cache=st.tuples(st.booleans(), st.booleans()),
        overlap=st.tuples(st.booleans(), st.booleans()),
        seed=SETUP["seed"],
    )
    def setup(
        self,
        shared: dict[str, Any],
        kv_tokens: tuple[int, int],
        prefix_cache: tuple[bool, bool],
        overlap: tuple[bool, bool],
        seed: int,
    ) -> None:
        def config(role: str, tokens: int, cache: bool) -> SchedulerConfig:
            pages = tokens // shared["page_size"]
            return SchedulerConfig(
                num_pages=pages,
                prefix_cache=cache,
                new_token_ratio_decay_steps=8,
                role=role,
                **shared,
            )

        self.seed = seed
        self.tracked: dict[str, Tracked] = {}
        self.transfers: dict[str, Transfer] = {}  # handed off, pages held on the prefill side
        self.receives: dict[str, Receive] = {}  # reserved on the decode side, not landed
        self.n = 0
        self.p = Side(config("prefill", kv_tokens[0], prefix_cache[0]), overlap[0], self)
        self.d = Side(config("decode", kv_tokens[1], prefix_cache[1]), overlap[1], self)

    def token_of(self, rid: str, position: int) -> int:
        prompt = self.tracked[rid].prompt
        if position < len(prompt):
            return prompt[position]
        return sampled_token(self.seed, rid, position - len(prompt))

    def rids(self, which: Callable[[Tracked], bool]) -> list[str]:
        return sorted(rid for rid, t in self.tracked.items() if which(t))

    # ------------------------------------------------------------------ rules
    @rule(
        prefix=st.sampled_from(range(len(PREFIXES))),
        suffix=st.lists(st.integers(0, VOCAB - 1), max_size=8),
        limit=st.integers(1, 10),
        stop=st.booleans(),
    )
    def add(self, prefix: int, suffix: list[int], limit: int, stop: bool) -> None:
        rid = f"r{self.n}"
        self.n += 1
        t = Tracked(PREFIXES[prefix] + suffix, limit, stop)
        try:
            self.p.s.add(t.request(rid))
        except RequestRejected:
            return
        self.tracked[rid] = t

    @rule(prefill=st.booleans())
    def schedule(self, prefill: bool) -> None:
        side = self.p if prefill else self.d
        if side.can_schedule():
            self.scheduled(side)

    @rule(prefill=st.booleans())
    def complete(self, prefill: bool) -> None:
        side = self.p if prefill else self.d
        if side.outstanding:
            self.completed(side)

    @rule(n=st.integers(1, 6), prefill=st.booleans())
    def engine_loop(self, n: int, prefill: bool) -> None:
        side = self.p if prefill else self.d
        for _ in range(n):
            if side.s.has_work():
                side.iterate()

    @rule(n=st.integers(1, 8), land=st.booleans())
    def cluster_loop(self, n: int, land: bool) -> None:
        """``n`` rounds of both loops, every hand-off sent and (``land``) every transfer landed
        and acknowledged at once."""
        for _ in range(n):
            self.cluster_round(land)

    @precondition(lambda self: bool(self.rids(unsent)))
    @rule(data=st.data())
    def send(self, data: st.DataObject) -> None:
        """The decode instance takes a handed-off request (or cannot, ever: the transfer fails)."""
        self.send_one(data.draw(st.sampled_from(self.rids(unsent))))

    @precondition(lambda self: bool(self.receives))
    @rule(data=st.data())
    def land(self, data: st.DataObject) -> None:
        """A transfer copies the prefill side's pages and reports them landed."""
        self.land_one(data.draw(st.sampled_from(sorted(self.receives))))

    @precondition(lambda self: bool(self.rids(landed_and_held)))
    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        self.acknowledge_one(data.draw(st.sampled_from(self.rids(landed_and_held))))

    @precondition(lambda self: bool(self.rids(in_transfer)))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        """A transfer fails: both sides abort the request."""
        rid = data.draw(st.sampled_from(self.rids(in_transfer)))
        req = self.d.s.get(rid)
        event(f"transfer failed: decode side {req.status if req is not None else 'none'}")
        self.abort_both(rid)

    @precondition(lambda self: bool(self.rids(not_ended)))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.rids(not_ended)))
        t, req = self.tracked[rid], self.d.s.get(rid)
        event(f"abort: prefill {t.p}, decode {req.status if req is not None else t.d}")
        self.abort_both(rid)

    # ------------------------------------------------------------------ the calls
    def scheduled(self, side: Side) -> None:
        plan = side.schedule()
        if side is self.p:
            assert not plan.decode, "a prefill-role scheduler decodes"
            return
        for rid in [c.rid for c in plan.prefill] + [d.rid for d in plan.decode]:
            assert self.tracked[rid].landed, f"{rid} placed before its KV landed"
        if plan.prefill:
            event("decode side recomputes")
        for receive in self.d.s.take_receives():
            t = self.tracked[receive.rid]
            assert t.d == "live" and not t.landed and receive.rid not in self.receives
            ship = self.transfers[receive.rid]
            assert receive.first + len(receive.pages) == len(ship.pages)
            assert len(ship.pages) == pages_for(len(t.prompt), side.s.page_size)
            self.receives[receive.rid] = receive
            if receive.first:
                event("decode prefix hit")

    def completed(self, side: Side) -> None:
        for e in side.complete():
            t = self.tracked[e.rid]
            if isinstance(e, TokenOut):
                assert t.reason is None, f"token for {e.rid} after it ended"
                assert e.first == (side is self.p)
                t.delivered.append(e.token)
                continue
            if isinstance(e, Preempted):
                assert side is self.d and t.landed, "only a landed request is preempted"
                event("decode side preempts")
                continue
            assert isinstance(e, Finished)
            if side is self.p:
                assert t.p in ("live", "aborting")
                t.p = "held" if e.reason is FinishReason.HANDOFF else "gone"
            else:
                assert t.d in ("live", "aborting")
                t.d = "gone"
            if e.reason is FinishReason.ABORT:
                assert t.aborted
            elif e.reason is FinishReason.HANDOFF:
                event("handed off")
                ship = self.p.s.transfer(e.rid)
                assert ship is not None
                assert (ship.prompt, ship.first_token) == (tuple(t.prompt), t.delivered[0])
                assert ship.max_new_tokens == t.limit > 1
                self.transfers[e.rid] = ship
            else:
                assert t.reason is None
                t.reason = e.reason
                assert e.num_output_tokens == len(t.delivered)

    def send_one(self, rid: str) -> None:
        t, ship = self.tracked[rid], self.transfers[rid]
        req = t.request(rid)
        try:
            self.d.s.add_incoming(req, ship.first_token)
        except RequestRejected:  # larger than the decode side's pool: the transfer fails
            self.abort_both(rid)
            return
        t.d = "live"

    def land_one(self, rid: str) -> None:
        receive, ship = self.receives.pop(rid), self.transfers[rid]
        for i, page in enumerate(receive.pages):
            self.d.kv.device[page] = dict(self.p.kv.device[ship.pages[receive.first + i]])
        assert self.d.s.kv_landed(rid)
        self.tracked[rid].landed = True
        event("landed")

    def abort_both(self, rid: str) -> None:
        t = self.tracked[rid]
        assert self.p.s.abort(rid) == (t.p in ("live", "held"))
        assert self.d.s.abort(rid) == (t.d == "live")
        t.p = {"live": "aborting", "held": "gone"}.get(t.p, t.p)
        t.d = {"live": "aborting"}.get(t.d, t.d)
        self.transfers.pop(rid, None)
        self.receives.pop(rid, None)
        if t.reason is None:
            t.aborted, t.reason = True, FinishReason.ABORT

    # ------------------------------------------------------------------ checks
    @invariant()
    def both_cores(self) -> None:
        if not hasattr(self, "p"):
            return
        check_invariants(self.p.s)
        check_invariants(self.d.s)
        held = self.p.s.held_for_transfer()
        waiting = self.rids(lambda t: t.p == "held")
        assert sorted(held) == waiting, "held for transfer: exactly the unacknowledged"
        for rid in waiting:
            assert self.p.s.transfer(rid) == self.transfers[rid]

    def teardown(self) -> None:
        if not hasattr(self, "p"):
            return
        for _ in range(500):
            busy = self.cluster_round()
            self.both_cores()
            if not busy and not self.p.s.held_for_transfer() and not self.receives:
                break
        for s in (self.p.s, self.d.s):
            assert not s.has_work() and not s.held_for_transfer()
            stats = s.stats()
            assert stats.pages_free + stats.pages_cached == stats.num_pages, "pages leaked"
        for rid, t in self.tracked.items():
            assert t.reason is not None, f"{rid} never ended"
            truth = [sampled_token(self.seed, rid, i) for i in range(len(t.delivered))]
            assert t.delivered == truth, f"{rid}: tokens differ from a colocated run"
            if t.aborted:
                continue
            stops = [i for i, token in enumerate(truth) if t.stop and token == STOP_TOKEN]
            end = min(stops[0] + 1 if stops else t.limit, t.limit)
            assert len(t.delivered) == end, f"{rid}: {len(t.delivered)} tokens, expected {end}"
            expected = FinishReason.STOP if stops and stops[0] + 1 == end else FinishReason.LENGTH
            assert t.reason is expected

    def cluster_round(self, land: bool = True) -> bool:
        """One round of both engine loops and of every transfer; whether work is left."""
        busy = False
        for side in (self.p, self.d):
            if side.s.has_work():
                side.iterate()
            elif side.outstanding:
                self.completed(side)
            busy = busy or side.s.has_work() or bool(side.outstanding)
        for rid in self.rids(unsent):
            self.send_one(rid)
        if land:
            for rid in sorted(self.receives):
                self.land_one(rid)
            for rid in self.rids(landed_and_held):
                self.acknowledge_one(rid)
        return busy

    def acknowledge_one(self, rid: str) -> None:
        assert self.p.s.transfer_done(rid)
        self.tracked[rid].p = "gone"
        del self.transfers[rid]


HandoffMachine.TestCase.settings = machine_settings(200, 60)
TestHandoffMachine = HandoffMachine.TestCase
