"""Prefill/decode disaggregation: the prefill and decode roles' half of ``Scheduler``.

A *prefill-role* scheduler (``SchedulerConfig.role``) computes prompts and hands each
request off after its first token; a *decode-role* one takes requests with their KV and
decodes them. Moving the KV between the two is the caller's (the engine's mechanism, the
simulator's price); the core decides which pages it moves and when they are free. The
contract, in call order::

    prefill role                               decode role
    ------------                               -----------
    add(req)                                   add_incoming(req, first_token)
    schedule / complete: prefill as            schedule(now): admitted like any request
      colocated; the last chunk samples          (running cap, prefill budget gate, pages
      the first token: TokenOut, then            for prompt + first token, the decode
      Finished(rid, HANDOFF, 1)                  reservation); never placed until landed
    transfer(rid) -> Transfer  ─── ships ───►  take_receives() -> [Receive]: the pages to fill
      (pages held: not free, not evictable)    kv_landed(rid): every page landed; it decodes
    transfer_done(rid): the pages were read      from its first token on, as any request
    abort(rid): the transfer failed            abort(rid): at any point

A prefill-role scheduler plans one output token per request: ``add`` caps
``max_new_tokens`` at one and keeps the request's own limit, which it gives back when
the request ends and ships in ``Transfer``. A first token that is a stop token, or a
limit of one token, ends the request there (``STOP``, ``LENGTH``): nothing to hand off.
``transfer_done`` and ``abort`` of a held transfer release its pages the same way, at
once, as a finished request's are: computed full pages into the prefix cache (their
KV is intact either way), the rest freed.

A decode-role scheduler reserves the pages of the prompt plus the first token; its
prefix cache serves incoming requests as any: cached full prompt pages are shared, and
``Receive.first`` says how many, so only ``Transfer.pages[first:]`` moves (into
``Receive.pages``, one for one; both roles use the same page size). Until it landed the
request holds its pages and counts as running (and as work: ``has_work``), but no plan
places it and it is never preempted; once landed it is a decoding request like any
(preempted, it recomputes its prompt and output here). Its abort releases its pages at
the next step, like any abort.

Pages released by an abort or an acknowledgment are reused at once: the caller stops
its transfer (or lets it end) before it reports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.scheduler.completion import Completion
from core.scheduler.memory import HeldPages
from core.scheduler.pages import pages_for
from core.scheduler.plan import Receive, Transfer
from core.scheduler.request import Request, RequestRejected, RequestStatus, check_servable


class Handoff(Completion):
    """The roles' calls, over the scheduler's state (``Scheduler`` inherits them)."""

    _receiving: list[Request]  # decode role: admitted into RECEIVING since ``take_receives``

    if TYPE_CHECKING:

        def _queue(self, req: Request, status: RequestStatus) -> None: ...  # Scheduler's

    # ------------------------------------------------------------------ prefill role
    def transfer(self, rid: str) -> Transfer | None:
        """What to ship for the handed-off ``rid``, while its pages are held; else None."""
        held = self._transfers.get(rid)
        return held[0] if held is not None else None

    def transfer_done(self, rid: str) -> bool:
        """The transfer of ``rid`` read its pages: release them (False if none are held)."""
        return self._end_transfer(rid)

    def held_for_transfer(self) -> dict[str, HeldPages]:
        """The pages held for transfer, by handed-off request."""
        return {rid: held for rid, (_, held) in self._transfers.items()}

    def _end_transfer(self, rid: str) -> bool:
        entry = self._transfers.pop(rid, None)
        if entry is None:
            return False
        self._changes += 1
        self.memory.give_back(entry[1], self.step)
        return True

    # ------------------------------------------------------------------ decode role
    def add_incoming(self, req: Request, first_token: int) -> None:
        """Queue a request whose prompt's KV a prefill instance computed and whose first
        output token it sampled. Raises ``RequestRejected`` if it can never be served here,
        has nothing left to decode, or this is not a decode-role scheduler."""
        if self.config.role != "decode":
            raise RequestRejected(f"request {req.rid}: a {self.config.role} scheduler takes no KV")
        if req.rid in self.requests:
            raise RequestRejected(f"duplicate request id {req.rid!r}")
        check_servable(req, self.config)
        if req.max_new_tokens < 2 or first_token in req.stop_token_ids:
            raise RequestRejected(f"request {req.rid}: its first token ends it, nothing to decode")
        req.output = [first_token]
        self._queue(req, RequestStatus.INCOMING)

    def take_receives(self) -> list[Receive]:
        """The pages to fill of each request admitted since the last call (in admission
        order), for the transfers to start; aborted ones are left out."""
        ps = self.page_size
        receives = []
        for req in self._receiving:
            if req.status is RequestStatus.RECEIVING:
                first, end = req.num_shared_pages, pages_for(req.prompt_len, ps)
                receives.append(Receive(req.rid, first, req.pages[first:end]))
        self._receiving = []
        return receives

    def kv_landed(self, rid: str) -> bool:
        """Every page of ``rid``'s transfer landed: from the next plan on it decodes, its first
        token at position ``prompt_len``. False if ``rid`` ended or was aborted meanwhile;
        ``ValueError`` if it has no pages in transfer (not admitted yet, or landed already)."""
        req = self.requests.get(rid)
        if req is None or req.status is RequestStatus.ABORTED:
            return False
        if req.status is not RequestStatus.RECEIVING:
            raise ValueError(f"request {rid} has no KV in transfer (it is {req.status})")
        self._changes += 1
        req.status = RequestStatus.DECODING
        req.num_planned = req.prompt_len
        self._hold(req, self.memory.share_prefix(req, req.prompt_len, self.step))
        return True
