"""The decode role's hand-offs: pair each request with its prefill, reserve, land, decode.

A request of this server's frontend (``add``) and the ``Handoff`` of its prefill server
meet by room, whichever comes first; the request then enters the core with its first
token (``StepDriver.add_incoming``, whose item streams that token to the client). Once
the core admitted it (``take_receives``) the receiver expects its pages and the prefill
server is told where to send them (``HandoffReply``); when they landed (``KVReceiver.poll``)
the core decodes it (``kv_landed``). See ``engine.scheduler_proc.pd``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import zmq

from engine.ipc import messages
from engine.kvcache.pool import KVPool
from engine.kvcache.transfer import CANCELLED_KEPT, KVReceiver
from engine.scheduler_proc import pd_wire
from engine.scheduler_proc.driver import StepDriver, rejected
from engine.scheduler_proc.pd import TransferCounters, wait_ms

log = logging.getLogger(__name__)

FAILED = 503  # the HTTP status of a request whose hand-off failed (the pair may be retried)
TIMED_OUT = 504


@dataclass(slots=True)
class _Local:
    """A request of this server's frontend, waiting for its hand-off until ``deadline``."""

    msg: messages.TokenizedRequest
    deadline: float


@dataclass(slots=True)
class _Remote:
    """A hand-off (from the prefill socket ``identity``) waiting for its request."""

    identity: bytes
    handoff: pd_wire.Handoff
    deadline: float


@dataclass(slots=True)
class _Landing:
    """Pages reserved for ``rid``'s KV, expected until ``deadline``."""

    rid: str
    pages: int
    deadline: float


class DecodeHandoffs:
    """``Handoffs`` of a decode-role scheduler: hand-offs taken on a ROUTER socket bound on
    ``host`` (``address``), KV received into ``pool`` (``receiver.address``)."""

    def __init__(
        self, driver: StepDriver, pool: KVPool, host: str, timeout_s: float, cuda_ipc: bool
    ) -> None:
        self.driver = driver
        self.page_size = pool.page_size
        self.timeout_s = timeout_s
        self.receiver = KVReceiver(f"tcp://{host}:*", pool)
        self.kv_device = self.receiver.device if cuda_ipc else ""  # named: CUDA IPC from it
        self.counters = TransferCounters()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(f"tcp://{host}:*")
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.local: dict[str, _Local] = {}  # room -> a request without its hand-off yet
        self.remote: dict[str, _Remote] = {}  # room -> a hand-off without its request yet
        self.admitting: dict[str, tuple[str, bytes]] = {}  # rid -> room, prefill socket
        self.landing: dict[str, _Landing] = {}  # room (the transfer id) -> its pages
        self.rooms: dict[str, str] = {}  # rid -> room, from its pairing until its KV landed
        self.refused: OrderedDict[str, None] = OrderedDict()  # rooms aborted before pairing

    def add(self, msg: messages.TokenizedRequest) -> messages.TokenItem | None:
        if msg.pd is None:
            return rejected(msg.rid, "a decode server serves only requests with pd.room")
        room = msg.pd.room
        if room in self.local or room in self.rooms.values():
            return rejected(msg.rid, f"pd.room {room!r} is in use")
        remote = self.remote.pop(room, None)
        if remote is None:
            self.local[room] = _Local(msg, time.monotonic() + self.timeout_s)
            return None
        return self._pair(msg, remote.identity, remote.handoff)

    def abort(self, rid: str) -> None:
        room = self.rooms.pop(rid, None)
        for waiting, local in list(self.local.items()):
            if local.msg.rid == rid:
                del self.local[waiting]
                self.refused[waiting] = None
                if len(self.refused) > CANCELLED_KEPT:
                    self.refused.popitem(last=False)
        paired = self.admitting.pop(rid, None)
        if paired is not None:
            self._reply(paired[1], pd_wire.HandoffReply(paired[0], False, "aborted on decode"))
        if room is not None and self.landing.pop(room, None) is not None:
            self.receiver.cancel(room)  # a late arrival is refused: the prefill side aborts

    def after_step(self, items: list[messages.TokenItem]) -> list[messages.TokenItem]:
        out = self._messages()
        self._admitted()
        out += self._landed()
        now = time.monotonic()
        for room, local in list(self.local.items()):
            if now >= local.deadline:
                del self.local[room]
                why = f"no prefill server handed this request off within {self.timeout_s:g} s"
                out.append(rejected(local.msg.rid, why, TIMED_OUT))
        for room, remote in list(self.remote.items()):
            if now >= remote.deadline:
                del self.remote[room]
                why = "its request never reached the decode server"
                self._reply(remote.identity, pd_wire.HandoffReply(room, False, why))
        for room, landing in list(self.landing.items()):
            if now >= landing.deadline:
                del self.landing[room]
                self.receiver.cancel(room)
                self.rooms.pop(landing.rid, None)
                self.counters.ended["timeout"] += 1
                why = f"its KV did not arrive within {self.timeout_s:g} s"
                out.append(self._fail(landing.rid, why, TIMED_OUT))
        return out

    def wait_ms(self, timeout_ms: int) -> int:
        deadlines = [x.deadline for x in self.local.values()]
        deadlines += [x.deadline for x in self.remote.values()]
        return wait_ms(timeout_ms, deadlines, spin=bool(self.landing))

    def sockets(self) -> list[zmq.Socket[bytes]]:
        return [self._sock]

    def stats(self) -> messages.TransferStats:
        waiting = len(self.local) + len(self.remote) + len(self.admitting) + len(self.landing)
        return self.counters.snapshot(waiting, sum(x.pages for x in self.landing.values()))

    def close(self) -> None:
        self.receiver.close()
        self._sock.close(linger=0)
        self._ctx.term()

    def _messages(self) -> list[messages.TokenItem]:
        """Take every hand-off and cancellation waiting on the socket."""
        out: list[messages.TokenItem] = []
        while True:
            try:
                identity, data = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            except ValueError:  # not two frames
                log.error("dropped a malformed hand-off message")
                continue
            msg = pd_wire.decode(data)
            if isinstance(msg, pd_wire.Handoff):
                if msg.room in self.refused:
                    why = "its request was aborted on the decode server"
                    self._reply(identity, pd_wire.HandoffReply(msg.room, False, why))
                elif (local := self.local.pop(msg.room, None)) is not None:
                    out.append(self._pair(local.msg, identity, msg))
                else:
                    deadline = time.monotonic() + self.timeout_s
                    self.remote[msg.room] = _Remote(identity, msg, deadline)
            elif isinstance(msg, pd_wire.HandoffCancel):
                out += self._cancel(msg.room, msg.reason)
            elif msg is not None:
                log.error("unexpected hand-off message %s", type(msg).__name__)

    def _pair(
        self, msg: messages.TokenizedRequest, identity: bytes, handoff: pd_wire.Handoff
    ) -> messages.TokenItem:
        """Queue ``msg`` with its ``handoff``: the item of its first token, or its error."""
        problem = mismatch(msg, handoff, self.page_size)
        if problem:
            self._reply(identity, pd_wire.HandoffReply(handoff.room, False, problem))
            return rejected(msg.rid, problem, FAILED)
        item = self.driver.add_incoming(msg, handoff.first_token, handoff.finish_reason)
        if handoff.finish_reason is not None:
            return item
        if item.error is not None:
            self._reply(identity, pd_wire.HandoffReply(handoff.room, False, item.error))
            return item
        self.admitting[msg.rid] = (handoff.room, identity)
        self.rooms[msg.rid] = handoff.room
        log.debug("rid %s paired with %s (room %s)", msg.rid, handoff.rid, handoff.room)
        return item

    def _admitted(self) -> None:
        """Reserve the pages of every request the core admitted; tell its prefill server."""
        for receive in self.driver.core.take_receives():
            paired = self.admitting.pop(receive.rid, None)
            if paired is None:
                continue
            room, identity = paired
            if receive.pages:
                self.receiver.expect(room, receive.pages)
                deadline = time.monotonic() + self.timeout_s
                self.landing[room] = _Landing(receive.rid, len(receive.pages), deadline)
            else:  # the prefix cache holds every page of its prompt
                self.rooms.pop(receive.rid, None)
                self.driver.core.kv_landed(receive.rid)
            reply = pd_wire.HandoffReply(
                room, True, "", room, receive.first, len(receive.pages), self.receiver.address,
                self.kv_device,
            )  # fmt: skip
            self._reply(identity, reply)

    def _landed(self) -> list[messages.TokenItem]:
        """Let every request whose KV landed decode; fail those whose KV did not fit."""
        out = []
        for result in self.receiver.poll():
            self.counters.count(result)
            landing = self.landing.pop(result.transfer_id, None)
            if landing is None:
                continue
            self.rooms.pop(landing.rid, None)
            if result.ok:
                self.driver.core.kv_landed(landing.rid)
            else:
                why = f"its KV did not fit this server ({result.detail})"
                out.append(self._fail(landing.rid, why, FAILED))
        return out

    def _cancel(self, room: str, reason: str) -> list[messages.TokenItem]:
        """The prefill server gave up ``room``: fail its request here."""
        self.remote.pop(room, None)
        local = self.local.pop(room, None)
        why = f"the prefill server gave the request up: {reason}"
        if local is not None:
            return [rejected(local.msg.rid, why, FAILED)]
        rid = next((r for r, paired in self.rooms.items() if paired == room), None)
        if rid is None:
            return []
        self.abort(rid)
        return [self._fail(rid, why, FAILED)]

    def _fail(self, rid: str, why: str, status: int) -> messages.TokenItem:
        self.driver.abort(rid, why)
        log.warning("rid %s: %s", rid, why)
        return rejected(rid, why, status)

    def _reply(self, identity: bytes, reply: pd_wire.HandoffReply) -> None:
        try:
            self._sock.send_multipart([identity, pd_wire.encode(reply)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the prefill server is gone: its own timeout fails it
            log.warning("cannot answer the hand-off of room %s: %s", reply.room, exc)


def mismatch(msg: messages.TokenizedRequest, handoff: pd_wire.Handoff, page_size: int) -> str:
    """Why ``handoff`` cannot continue ``msg`` here; empty when it can."""
    if handoff.page_size != page_size:
        return f"the prefill server's pages hold {handoff.page_size} tokens, these {page_size}"
    if handoff.finish_reason is None and handoff.prompt != msg.input_ids:
        return (
            f"the prefill server's prompt ({len(handoff.prompt)} tokens) is not this server's "
            f"({len(msg.input_ids)} tokens): do both serve the same model and tokenizer?"
        )
    return ""
