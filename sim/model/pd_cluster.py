"""The simulated disaggregated cluster: P prefill and D decode replicas behind a PD router.

Modelled on ``engine router --prefill ... --decode ...`` in front of ``engine serve --role
prefill`` and ``--role decode`` servers (``engine.scheduler_proc.pd``), in one SimPy
environment, each replica a ``ClusterReplica`` whose scheduler core has its role::

    arrival ─► prefill router ─► prefill replica p: front ─► scheduler: prefill, first token
            └► decode router ──► decode replica d:  front ─► (its half waits)
                                    ┌─────────────────────────────────┘
    p's step ends ── Handoff (ipc) ─► d pairs both halves: streams the first token, queues it
    d admits it (pages reserved) ── HandoffReply (ipc) ─► p sends the KV: transfer_time(tokens)
    KV landed, taken in between d's steps ─► d decodes it; acknowledged (ipc) ─► p releases

- Both routers place a request at its arrival, each by its own core (the routers'
  settings, each set its own books); the request's front times (``arrival`` to
  ``sched_arrival``) are the prefill replica's, its tokens the decode replica's, which
  streams them all, the first included (``replica`` in the request table: the decode one).
- Each replica takes what the other side sends it at its loop's next iteration, after
  the step running then (a decode run is cut for it), as the engine's loop does between
  steps. Control messages cost the profile's ``ipc``; the KV, ``TransferCosts``; pages
  the decode replica's prefix cache holds are not sent. The decode replica takes landed KV
  in at its next iteration and acknowledges it then, so a transfer's time from the send to
  the acknowledgment the prefill replica takes in counts both loops' waits, as the
  engine's does.
- A request whose first token ends it (a limit of one token) moves no KV: the decode
  replica ends it as it pairs it. A request one side rejects fails on both.
- A replica's loop ends once routing is done and no request is open on either side.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from core.router import Router, RouteRequest
from core.scheduler import Request
from core.scheduler.plan import Finished, FinishReason, Plan, Preempted, Receive, TokenOut
from sim.costs.base import CpuCosts, GpuCostModel
from sim.costs.transfer import TransferCosts
from sim.model.cluster import Cluster, ClusterReplica
from sim.model.pipeline import delay_to
from sim.model.replica import RequestRecords


@dataclass(slots=True)
class TransferTotals:
    """The KV transfers of a run: how many moved pages, their KV tokens, their priced time
    on the wire (``wire_seconds``) and the time from each send to the acknowledgment the
    prefill side took in (``seconds``: the engine's ``engine_kv_transfer_seconds_total`` on
    a prefill server, which also counts each side's wait for its loop's step to end)."""

    count: int = 0
    tokens: int = 0
    wire_seconds: float = 0.0
    seconds: float = 0.0

    def describe(self) -> dict[str, Any]:
        mean = self.seconds / self.count if self.count else None
        wire = self.wire_seconds / self.count if self.count else None
        return {"count": self.count, "tokens": self.tokens, "seconds": self.seconds,
                "mean_s": mean, "wire_seconds": self.wire_seconds, "wire_mean_s": wire}  # fmt: skip


class PrefillReplica(ClusterReplica):
    """A prefill-role server: prefills, hands off, sends the KV once the decode side answers."""

    transfers_kv = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert isinstance(self.cluster, PDCluster)
        self.pd = self.cluster
        self.replies: list[tuple[int, Receive]] = []  # decode sides' answers, not yet taken
        self.sending: dict[int, tuple[float, int]] = {}  # KV sent, not acknowledged: when, bytes
        self.acked: list[int] = []  # transfers acknowledged, pages not yet released
        self.cancelled: list[int] = []  # requests the decode side failed

    def handle_events(self, plan: Plan, events: list[Any], end: float) -> None:
        """A step's first tokens go to the decode replica with the hand-off, not to a client."""
        for e in events:
            i = self.index[e.rid]
            if type(e) is Finished:
                del self.reqs[i]
                self.pd.handed_off(i, e.reason is FinishReason.HANDOFF)
            elif type(e) is Preempted:
                self.preemptions[i] += 1
            elif type(e) is not TokenOut:
                raise TypeError(f"unexpected event {e!r}")

    def admit_inbox(self) -> float:
        taking_in = super().admit_inbox()
        sched, pd = self.sched, self.pd
        replies, self.replies = self.replies, []
        now = self.env.now
        for i, receive in replies:
            transfer = sched.transfer(receive.rid)
            if transfer is None:  # aborted meanwhile
                continue
            tokens = max(transfer.prompt_len - receive.first * sched.page_size, 0)
            if tokens:
                self.sending[i] = (now, pd.send_kv(i, tokens))
            else:  # the decode side's prefix cache holds it all: nothing to send
                self.acked.append(i)
        for i in self.acked:  # its pages were read: released, as a finished request's
            sent = self.sending.pop(i, None)
            if sent is not None:
                pd.totals.seconds += now - sent[0]
                if self.loop.record is not None:
                    self.loop.record.note_transfer(sent[1], now - sent[0])
            sched.transfer_done(self.trace[i].rid)
            self.router.finished(self.trace[i].rid, now)
            pd.side_done(i)
        for i in self.cancelled:
            sched.abort(self.trace[i].rid)
            self.router.aborted(self.trace[i].rid, now)
            pd.side_done(i)
        self.acked, self.cancelled = [], []
        return taking_in

    def ended(self, i: int, rejected: bool) -> None:
        super().ended(i, rejected)  # rejected at admission: the request fails on both sides
        self.pd.failed_on_prefill(i)

    def nothing_to_come(self) -> bool:
        idle = not (self.replies or self.acked or self.cancelled)
        return super().nothing_to_come() and idle and self.pd.open == 0


class DecodeReplica(ClusterReplica):
    """A decode-role server: pairs a request with its hand-off, takes its KV, decodes it."""

    transfers_kv = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert isinstance(self.cluster, PDCluster)
        self.pd = self.cluster
        self.halves: set[int] = set()  # its own requests that reached the scheduler
        self.handoffs: dict[int, bool] = {}  # hand-offs come: whether the first token ended it
        self.ready: list[int] = []  # both halves here, not yet paired
        self.landed: list[tuple[int, int, float]] = []  # KV landed (bytes, priced s), not taken

    def enter(self, i: int, now: float) -> None:
        """Its half of request ``i``: timed through this server's own front (its records are
        the prefill replica's)."""
        sched = self.front.enter(now, self.trace[i].input_length)[-1]
        self.on_way += 1
        reach = self.env.timeout(delay_to(now, sched))
        reach.callbacks.append(lambda _: self._half(i))

    def _half(self, i: int) -> None:
        self.on_way -= 1
        if self.pd.failed[i]:
            self.pd.side_done(i)
            return
        self.halves.add(i)
        if i in self.handoffs:
            self.ready.append(i)
        self.wake()

    def handoff(self, i: int, ends: bool) -> None:
        """Request ``i``'s hand-off reached this server."""
        self.handoffs[i] = ends
        if i in self.halves:
            self.ready.append(i)
            self.wake()

    def admit_inbox(self) -> float:
        now = self.env.now
        ready, self.ready = self.ready, []
        for i in ready:
            self.halves.discard(i)
            self._pair(i, self.handoffs.pop(i), now)
        landed, self.landed = self.landed, []
        for i, nbytes, seconds in landed:  # taken in (scattered) between steps, acknowledged
            self.sched.kv_landed(self.trace[i].rid)
            self.pd.acknowledge(i)
            if self.loop.record is not None:
                self.loop.record.note_transfer(nbytes, seconds)
        return super().admit_inbox()

    def _pair(self, i: int, ends: bool, now: float) -> None:
        """Queue request ``i`` with its KV to come, and stream its first token; or end it."""
        if not ends and not self.queue_request(i, self._add_incoming, now):
            self.pd.cancel_prefill(i)
            return
        g = self.delivery.step(now, [i])
        self.first_step[i] = g
        self.stream_tokens((now,), 1)
        if ends:
            self.finish_step[i] = g
            self.times["finished"][i] = now
            self.status[i] = "completed"
            self.ended(i, False)

    def _add_incoming(self, req: Request) -> None:
        self.sched.add_incoming(req, 0)  # the token's id is the prefill side's: none here

    def note_scheduled(self, plan: Plan) -> None:
        """Answer the hand-off of every request admitted (its pages reserved); one whose every
        page the prefix cache holds has its KV at once."""
        for receive in self.sched.take_receives():
            i = self.index[receive.rid]
            if not receive.pages:
                self.sched.kv_landed(receive.rid)
            self.pd.answer(i, receive)

    def ended(self, i: int, rejected: bool) -> None:
        super().ended(i, rejected)
        self.pd.side_done(i)

    def nothing_to_come(self) -> bool:
        idle = not (self.ready or self.landed or self.halves)
        return super().nothing_to_come() and idle and self.pd.open == 0


class PDCluster(Cluster):
    """One replay on ``num_prefill`` prefill replicas and the rest decode replicas (the
    ``schedulers`` in that order, each core of its role), behind ``routers`` (prefill,
    decode), the KV priced by ``transfer``; ``run()`` it as a ``Cluster``."""

    def __init__(
        self,
        records: RequestRecords,
        schedulers: list[Any],
        num_prefill: int,
        routers: tuple[Router, Router],
        costs: tuple[GpuCostModel, CpuCosts],
        transfer: TransferCosts,
        **options: Any,
    ) -> None:
        self.num_prefill = num_prefill
        self.prefill_router, self.decode_router = routers
        self.transfer = transfer
        self.ipc = costs[1].ipc
        n = len(records.trace)
        self.left = array("b", [2]) * n  # per request: sides (prefill, decode) still open
        self.failed = array("b", [0]) * n
        self.prefill_of = array("q", [-1]) * n
        self.open = 0  # requests with a side still open
        self.totals = TransferTotals()
        super().__init__(records, schedulers, self.decode_router, costs, **options)

    def _replica(
        self, k: int, scheduler: Any, costs: tuple[GpuCostModel, CpuCosts], **settings: Any
    ) -> ClusterReplica:
        if k < self.num_prefill:
            return PrefillReplica(
                self, f"prefill{k}", scheduler, *costs, router=self.prefill_router, **settings
            )
        name = f"decode{k - self.num_prefill}"
        return DecodeReplica(self, name, scheduler, *costs, router=self.decode_router, **settings)

    def _place(self, i: int, request: RouteRequest, now: float) -> None:
        """Request ``i`` to a prefill replica and a decode replica, each router's pick now."""
        p = self._by_name[self.prefill_router.route(request, now)]
        d = self._by_name[self.decode_router.route(request, now)]
        self.prefill_of[i], self.replica_of[i] = p, d
        self.open += 1
        self.replicas[p].enter(i, now)
        self.replicas[d].enter(i, now)

    # ------------------------------------------------------------------ between the sides
    def _prefill(self, i: int) -> PrefillReplica:
        replica = self.replicas[self.prefill_of[i]]
        assert isinstance(replica, PrefillReplica)
        return replica

    def _decode(self, i: int) -> DecodeReplica:
        replica = self.replicas[self.replica_of[i]]
        assert isinstance(replica, DecodeReplica)
        return replica

    def handed_off(self, i: int, with_kv: bool) -> None:
        """Request ``i``'s prefill ended now (its first token; ``with_kv``: KV to move)."""
        decode = self._decode(i)

        def arrive() -> None:
            decode.handoff(i, not with_kv)

        self.env.timeout(self.ipc).callbacks.append(lambda _: arrive())
        if not with_kv:  # nothing held: the prefill side is done
            self._prefill(i).router.finished(self.records.trace[i].rid, self.env.now)
            self.side_done(i)

    def _post(self, replica: ClusterReplica, box: str, item: Any, delay: float) -> None:
        """``item`` into ``replica``'s list ``box`` ``delay`` from now, waking its loop."""

        def arrive() -> None:
            getattr(replica, box).append(item)
            replica.wake()

        self.env.timeout(delay).callbacks.append(lambda _: arrive())

    def answer(self, i: int, receive: Receive) -> None:
        """The decode side reserved request ``i``'s pages: tell its prefill side."""
        self._post(self._prefill(i), "replies", (i, receive), self.ipc)

    def send_kv(self, i: int, tokens: int) -> int:
        """The prefill side sends request ``i``'s ``tokens`` of KV now: it lands on the decode
        side ``transfer_time`` later. Returns its bytes: whole pages, as the engine sends."""
        seconds = self.transfer.transfer_time(tokens)
        page = self._prefill(i).sched.page_size
        nbytes = self.transfer.nbytes(-(-tokens // page) * page)
        self.totals.count += 1
        self.totals.tokens += tokens
        self.totals.wire_seconds += seconds
        self._post(self._decode(i), "landed", (i, nbytes, seconds), seconds)
        return nbytes

    def acknowledge(self, i: int) -> None:
        """The decode side took request ``i``'s KV in: its acknowledgment goes back."""
        self._post(self._prefill(i), "acked", i, self.ipc)

    def cancel_prefill(self, i: int) -> None:
        """The decode side failed request ``i``: its prefill side releases its pages."""
        self._post(self._prefill(i), "cancelled", i, self.ipc)

    def failed_on_prefill(self, i: int) -> None:
        """The prefill side rejected request ``i``: its decode half is dropped."""
        self.failed[i] = 1
        self.side_done(i)
        decode = self._decode(i)
        decode.router.aborted(self.records.trace[i].rid, self.env.now)
        if i in decode.halves:
            decode.halves.discard(i)
            self.side_done(i)

    def side_done(self, i: int) -> None:
        """One side of request ``i`` let go of it; with both, it is no longer open."""
        self.left[i] -= 1
        if self.left[i] == 0:
            self.open -= 1
            if self.open == 0 and self.routing_done:
                self._wake_all()

    def _wake_all(self) -> None:
        for replica in self.replicas:
            replica.wake()
