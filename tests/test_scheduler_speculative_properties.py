"""Property tests of speculative decoding in the scheduler core.

The scheduler of ``test_scheduler_properties`` is driven with a drafter that
guesses a deterministic model's tokens with noise, so that verification is
lossless: every request must end with exactly the tokens of a run without
speculation. Every plan is executed on a model of the KV content
(``tier_workload.KVContent``, draft positions included), so a rollback that
keeps a rejected position, or a cache page keyed over a rejected token, is
read by a later step as the wrong token.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from test_scheduler_properties import (
    SETUP,
    STOP_TOKEN,
    VOCAB,
    SchedulerMachine,
    fresh,
    machine_settings,
    sampled,
    sampled_token,
)
from tier_workload import KVContent

from core.scheduler import (
    Drafter,
    Event,
    Finished,
    FinishReason,
    PlaceholderDrafter,
    Plan,
    Request,
    Scheduler,
    SchedulerConfig,
    TokenOut,
)
from core.scheduler.invariants import check_invariants


def noisy(seed: int, rid: str, index: int, salt: object) -> int:
    return zlib.crc32(f"{seed}:{rid}:{index}:{salt}".encode())


class OracleDrafter:
    """Guesses the deterministic model's next tokens (``sampled_token``), each wrong with
    probability ``noise`` percent; with ``short`` it sometimes proposes fewer than asked."""

    def __init__(self, seed: int, noise: int, short: bool) -> None:
        self.seed, self.noise, self.short = seed, noise, short

    def propose(self, req: Request, k: int) -> Sequence[int]:
        first = len(req.output)
        out = []
        for i in range(k):
            token = sampled_token(self.seed, req.rid, first + i)
            if noisy(self.seed, req.rid, first + i, k) % 100 < self.noise:
                token = (token + 1) % VOCAB
            out.append(token)
        if self.short:
            out = out[: noisy(self.seed, req.rid, first, "short") % (k + 1)]
        return out


class DraftKV(KVContent):
    """``KVContent`` whose decode slots also write their draft tokens (garbage once rejected)."""

    def apply(self, plan: Plan) -> None:
        super().apply(plan)
        ps = self.page_size
        for d in plan.decode:
            for i, token in enumerate(d.draft):
                p = d.position + 1 + i
                self.device.setdefault(d.pages[p // ps], {})[p % ps] = token


def verify(plan: Plan, prompt_len: dict[str, int], seed: int) -> dict[str, int | list[int]]:
    """The verified tokens of a lossless verification by the deterministic model."""
    tokens: dict[str, int | list[int]] = {}
    tokens.update(sampled(plan, prompt_len.__getitem__, seed))
    for d in plan.decode:
        if not d.draft:
            continue  # its one token, an int, from ``sampled``
        first = d.position + 1 - prompt_len[d.rid]  # the output index sampled after position
        truth = [sampled_token(seed, d.rid, first + i) for i in range(len(d.draft) + 1)]
        m = 0
        while m < len(d.draft) and d.draft[m] == truth[m]:
            m += 1
        tokens[d.rid] = truth[: m + 1]
    return tokens


class SpeculativeMachine(SchedulerMachine):
    """``SchedulerMachine`` with speculation: lossless verification (``OracleDrafter``), or in
    simulation placeholders with accepted counts drawn from a hash."""

    @initialize(
        **SETUP
        | {  # fewer pages (drafts must compete for them), no reservation nor write-through
            "num_pages": st.integers(6, 16),
            "max_running": st.integers(1, 6),
            "prefix_cache": st.sampled_from([True, True, False]),
            "reserve": st.just(False),
            "host_pages": st.sampled_from([0, 0, 8]),
            "write_through": st.just(False),
        },
        num_draft_tokens=st.integers(1, 4),
        noise=st.sampled_from([0, 30, 100]),
        short=st.booleans(),
        simulated=st.sampled_from([False, False, True]),
    )
    def setup(  # type: ignore[override]
        self, num_draft_tokens: int, noise: int, short: bool, simulated: bool, **base: Any
    ) -> None:
        SchedulerMachine.setup(self, **base)
        seed, page_size = base["seed"], base["page_size"]
        self.config = replace(self.config, num_draft_tokens=num_draft_tokens)

        def drafter() -> Drafter:
            return PlaceholderDrafter() if simulated else OracleDrafter(seed, noise, short)

        self.s = Scheduler(self.config, drafter())
        self.twin = Scheduler(self.config, drafter())
        self.simulated = simulated
        self.delivered: dict[str, list[int]] = {}
        self.kv = None if simulated else DraftKV(page_size, self._token_of)
        event("simulated" if simulated else f"noise {noise}")

    def _token_of(self, rid: str, p: int) -> int:
        prompt = self.tracked[rid].req.prompt
        return prompt[p] if p < len(prompt) else sampled_token(self.seed, rid, p - len(prompt))

    @precondition(lambda self: len(self.outstanding) < (2 if self.overlap else 1))
    @rule()
    def schedule(self) -> None:
        before = self.outstanding[-1] if self.outstanding else None
        super().schedule()
        plan = self.outstanding[-1]
        drafted = {d.rid for d in before.decode if d.draft} if before else set()
        ps = self.config.page_size
        for d in plan.decode:
            t = self.tracked[d.rid]
            assert len(d.draft) <= self.config.num_draft_tokens
            assert len(d.pages) * ps >= d.position + 1 + len(d.draft), "drafts without pages"
            assert d.position + 1 + len(d.draft) - t.req.prompt_len <= t.limit, "past the limit"
            assert d.rid not in drafted, f"{d.rid} placed while its drafts are in flight"
        if plan.num_draft_tokens:
            event("drafted")
        if drafted and not any(d.rid in drafted for d in plan.decode):
            event("sat out")
        if self.kv is not None:
            self.kv.apply(plan)

    @precondition(lambda self: bool(self.outstanding))
    @rule()
    def complete(self) -> None:
        plan = self.outstanding.pop(0)
        if self.simulated:
            tokens = None
            accepted = {
                d.rid: noisy(self.seed, d.rid, d.position, "accepted") % (len(d.draft) + 1)
                for d in plan.decode
                if d.draft
            }
        else:
            prompt_len = {rid: t.req.prompt_len for rid, t in self.tracked.items()}
            tokens, accepted = verify(plan, prompt_len, self.seed), None
        events = self.s.complete(plan, tokens, accepted=accepted)
        assert events == self.twin.complete(plan, tokens, accepted=accepted)
        self._track(plan, events)
        for d in plan.decode:
            got = sum(1 for e in events if isinstance(e, TokenOut) and e.rid == d.rid)
            if d.draft and got > 1:
                event("draft tokens accepted")

    def _track(self, plan: Plan, events: list[Event]) -> None:
        super()._track(plan, events)
        for e in events:
            if isinstance(e, TokenOut):
                delivered = self.delivered.setdefault(e.rid, [])
                assert e.first == (not delivered), f"{e.rid}: first marks its first token only"
                delivered.append(e.token)

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        super().teardown()  # drains, checks every page came back; compares when overlapped
        if not self.overlap:
            self._compare_with_strict()
        for rid, t in self.tracked.items():
            delivered = self.delivered.get(rid, [])
            assert t.req.output == delivered, f"{rid}: output is not what was delivered"
            if t.reason is FinishReason.STOP:
                assert delivered[-1] == STOP_TOKEN
            if t.req.stop_token_ids:
                assert STOP_TOKEN not in delivered[:-1], f"{rid} went on after a stop token"

    def _compare_with_strict(self) -> None:
        """Requests never aborted end with exactly the tokens of a strict run without
        speculation (in simulation: as many tokens)."""
        kept = {rid: t for rid, t in self.tracked.items() if t.aborted_at_step is None}
        strict = Scheduler(self.config)  # no drafter: no speculation
        for t in kept.values():
            strict.add(fresh(t.req))
        got: dict[str, list[int]] = {rid: [] for rid in kept}
        ended: dict[str, FinishReason] = {}
        while strict.has_work():
            plan = strict.schedule(self.now)
            tokens = None
            if not self.simulated:
                tokens = sampled(plan, lambda rid: kept[rid].req.prompt_len, self.seed)
            for e in strict.complete(plan, tokens):
                if isinstance(e, TokenOut):
                    got[e.rid].append(e.token)
                elif isinstance(e, Finished):
                    ended[e.rid] = e.reason
        for rid, t in kept.items():
            assert (self.delivered.get(rid, []), t.reason) == (got[rid], ended[rid]), rid


SpeculativeMachine.TestCase.settings = machine_settings(80, 50)
TestSpeculativeMachine = SpeculativeMachine.TestCase


def test_random_speculative_runs_reach_their_cases() -> None:
    """A seeded run drafts, accepts, rolls back and preempts with drafts in flight."""
    rng = random.Random(7)
    config = SchedulerConfig(num_pages=10, page_size=2, max_running=4, num_draft_tokens=3)
    s = Scheduler(config, OracleDrafter(seed=0, noise=30, short=False))
    prompt_len: dict[str, int] = {}
    accepted = preempted = 0  # draft tokens accepted, requests preempted
    for i in range(300):
        if rng.random() < 0.3:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 8))]
            prompt_len[f"r{i}"] = len(prompt)
            s.add(Request(f"r{i}", len(prompt), rng.randint(1, 10), prompt=prompt))
        plan = s.schedule(float(i))
        preempted += len(plan.preempted)
        events = s.complete(plan, verify(plan, prompt_len, 0))
        drafted = {d.rid for d in plan.decode if d.draft}
        accepted += sum(1 for e in events if isinstance(e, TokenOut) and e.rid in drafted)
        accepted -= len(drafted)  # each drafted slot's own token
        check_invariants(s)
    assert accepted > 0 and preempted > 0
