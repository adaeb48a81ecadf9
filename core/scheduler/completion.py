"""Applying a plan's results: tokens become events, ended requests give their pages back.

``Completion`` is the half of ``Scheduler`` that ``complete`` runs (the
scheduler inherits it): the sampled or verified tokens of a plan are
delivered as ``TokenOut`` events, a stop token or the output limit ends a
request, and a slot with draft tokens rolls its request back to the verified
ones (``core.scheduler.speculative``). Pages a request gives up go back to
the pool at once, or when the plan in flight still using them completes
(``core.scheduler.inflight``). In the prefill role a request that reaches
its one planned token is handed off instead: its pages are held for their
transfer (``core.scheduler.handoff``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from core.scheduler.config import SchedulerConfig
from core.scheduler.drafter import Drafter
from core.scheduler.inflight import InFlight
from core.scheduler.memory import HeldPages, KVMemory
from core.scheduler.plan import (
    PLACEHOLDER_TOKEN,
    DecodeSlot,
    Event,
    Finished,
    FinishReason,
    Plan,
    Preempted,
    TokenOut,
    Transfer,
)
from core.scheduler.policy import Key
from core.scheduler.request import Request, RequestStatus
from core.scheduler.speculative import (
    Sampled,
    check_results,
    num_kept,
    surplus_pages,
    verified,
)


class Completion:
    """``complete`` and the release of pages, over the scheduler's state."""

    memory: KVMemory
    in_flight: InFlight
    running: dict[str, Request]  # admission order
    requests: dict[str, Request]  # live requests (not yet ended)
    page_size: int
    step: int
    _changes: int
    config: SchedulerConfig
    drafter: Drafter | None
    _waiting: list[tuple[Key, Request]]  # sorted by the policy's key
    _aborted: list[Request]  # marked, released at the next step
    _limits: dict[str, int]  # prefill role: rid -> its own max_new_tokens (it plans one here)
    _transfers: dict[str, tuple[Transfer, HeldPages]]  # prefill role: pages held for transfer

    @property
    def speculative(self) -> bool:
        """Whether decode slots carry draft tokens (a drafter and ``num_draft_tokens`` > 0)."""
        return self.drafter is not None and self.config.num_draft_tokens > 0

    def complete(
        self,
        plan: Plan,
        tokens: Mapping[str, Sampled] | None,
        *,
        accepted: Mapping[str, int] | None = None,
    ) -> list[Event]:
        """Apply the sampled ``tokens`` (rid -> token id; None in simulation) of ``plan``.

        For a slot with draft tokens, ``tokens[rid]`` is its verified tokens (the
        accepted draft prefix, then the model's next token: 1 to ``len(draft) + 1``;
        a plain int counts as one); in simulation ``accepted[rid]`` is how many of
        its draft tokens were accepted (missing: 0), and it gets that many plus one
        placeholders. ``ValueError`` on counts outside those ranges (nothing is
        applied then). The events of slots with drafts come after the others'.

        ``plan`` must be the oldest outstanding plan (``PlanOrderError`` otherwise).
        Slots of requests that ended, were aborted or were re-admitted since the
        plan was made produce nothing.
        """
        speculative = self.speculative or accepted is not None
        if speculative:
            check_results(plan, tokens, accepted)
        plain = cast(Mapping[str, int] | None, tokens)  # a slot without a draft has an int
        done = self.in_flight.pop(plan)
        self._changes += 1
        for held in done.held:
            self.memory.give_back(held, self.step)
        events: list[Event] = []
        for rid in plan.aborted:
            events.append(Finished(rid, FinishReason.ABORT, done.abort_counts[rid]))
        for rid in plan.preempted:
            events.append(Preempted(rid))
        for chunk in plan.prefill:
            req = self._placed_in(chunk.rid, plan.step)
            if req is None:
                continue
            self._hold(req, self.memory.share_prefix(req, chunk.start + chunk.length, self.step))
            if chunk.samples:
                self._append((req,), plain, events)
        running, aborted, step = self.running, RequestStatus.ABORTED, plan.step
        placed = (  # _placed_in, inlined: once per request and step
            req
            for rid, _, _, draft in plan.decode  # unpacked: faster than a named tuple's fields
            if not (speculative and draft)
            and (req := running.get(rid)) is not None
            and req.status is not aborted
            and req.admitted_at <= step
        )
        self._append(placed, plain, events)
        if not speculative:
            return events
        for slot in plan.decode:
            if slot.draft and (req := self._placed_in(slot.rid, step)) is not None:
                self._verify(req, slot, verified(slot, tokens, accepted), events)
        return events

    def _placed_in(self, rid: str, step: int) -> Request | None:
        """The running request that plan ``step`` placed as ``rid``, if it is still there (not
        ended, aborted or admitted again since)."""
        req = self.running.get(rid)
        if req is None or req.status is RequestStatus.ABORTED or req.admitted_at > step:
            return None
        return req

    def _append(
        self, reqs: Iterable[Request], tokens: Mapping[str, int] | None, events: list[Event]
    ) -> None:
        """Each of ``reqs``' sampled token (an int): a ``TokenOut``, and the request's end if the
        token ends it."""
        for req in reqs:
            token = PLACEHOLDER_TOKEN if tokens is None else tokens[req.rid]
            output = req.output
            events.append(TokenOut(req.rid, token, not output))
            output.append(token)
            if token in req.stop_token_ids:
                self._finish(req, FinishReason.STOP, events)
            elif len(output) >= req.max_new_tokens:
                self._finish(req, FinishReason.LENGTH, events)

    def _verify(
        self, req: Request, slot: DecodeSlot, new: Sequence[int], events: list[Event]
    ) -> None:
        """Deliver the verified tokens of ``req``'s draft-carrying ``slot`` and roll back to them:
        ``num_planned`` counts the positions whose KV holds verified tokens, the pages past
        them go back (``core.scheduler.speculative``)."""
        assert req.last_plan == self.in_flight.completed, "no later plan places it (sit-out)"
        kept = num_kept(req, new)
        req.num_planned = slot.position + kept  # before a finish releases its pages
        req.draft_in_flight = 0
        for token in new[:kept]:
            self._append((req,), {req.rid: token}, events)
        if req.status is RequestStatus.DECODING:
            self._hold(req, HeldPages((), surplus_pages(req, self.page_size)))

    def _release_aborted(self) -> dict[str, int]:
        """Release the requests aborted since the last step; their output token counts."""
        if not self._aborted:
            return {}
        counts: dict[str, int] = {}
        for req in self._aborted:
            if self._limits:
                self._lift_limit(req)
            counts[req.rid] = len(req.output)
            self.running.pop(req.rid, None)
            del self.requests[req.rid]
            self._release(req)
        self._waiting = [e for e in self._waiting if e[1].rid not in counts]
        self._aborted = []
        return counts

    def _finish(self, req: Request, reason: FinishReason, events: list[Event]) -> None:
        req.status = RequestStatus.FINISHED
        del self.running[req.rid]
        del self.requests[req.rid]
        if self._limits and self._lift_limit(req) and reason is FinishReason.LENGTH:
            self._hand_off(req)
            events.append(Finished(req.rid, FinishReason.HANDOFF, 1))
            return
        self._release(req)
        events.append(Finished(req.rid, reason, len(req.output)))

    def _lift_limit(self, req: Request) -> bool:
        """Prefill role: give ``req`` its own output limit back; whether it had one kept (a
        limit above one token, so that reaching one token hands it off)."""
        limit = self._limits.pop(req.rid, None)
        if limit is None:
            return False
        req.max_new_tokens = limit
        return True

    def _hand_off(self, req: Request) -> None:
        """Prefill role: hold ``req``'s pages for their transfer. No plan in flight uses them:
        the request was last placed by its sampling chunk, the plan completing now."""
        assert not self.in_flight.uses(req.last_plan), "a handed-off request is never placed"
        held = self.memory.take(req)
        ship = Transfer(
            req.rid,
            tuple(held.pages),
            req.prompt_len,
            tuple(req.prompt),
            req.output[0],
            req.max_new_tokens,
        )
        self._transfers[req.rid] = (ship, held)

    def _release(self, req: Request) -> None:
        """Take a request's pages: back to the pool now, or when the plan in flight using them
        completes."""
        self._hold(req, self.memory.take(req))

    def _hold(self, req: Request, held: HeldPages | None) -> None:
        if held is None or not (held.pages or held.node):
            return
        if self.in_flight.uses(req.last_plan):
            self.in_flight.hold(req.last_plan, held)
        else:
            self.memory.give_back(held, self.step)
