"""The prefill role's hand-offs: tell the decode server, push the KV, end the request.

A request the core hands off (``StepDriver.handed_off``) is announced to the decode server
its ``PDRoute`` names (``Handoff``); the decode server answers once it reserved pages
(``HandoffReply``); the pages go out with ``KVSender.send`` and are held until
``KVSender.poll`` sees them acknowledged (``transfer_done``) or failed (``abort``). The
request's client (the router) then gets its end: finish reason ``handoff``, or an error.
A request that ended with its first token (stop, length) is announced with its finish
reason and nothing to send. See ``engine.scheduler_proc.pd``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import zmq

from core.scheduler import Transfer
from engine.ipc import messages
from engine.kvcache.pool import KVPool
from engine.kvcache.transfer import KVSender
from engine.scheduler_proc import pd_wire
from engine.scheduler_proc.driver import StepDriver, rejected
from engine.scheduler_proc.pd import TransferCounters, wait_ms

log = logging.getLogger(__name__)

FAILED = 503  # the HTTP status of a request whose hand-off failed (the pair may be retried)


@dataclass(slots=True)
class _Announced:
    """A hand-off sent to ``peer``, waiting for its answer until ``deadline``."""

    rid: str
    peer: str
    transfer: Transfer
    deadline: float


class PrefillHandoffs:
    """``Handoffs`` of a prefill-role scheduler: its ``driver``'s requests, its ``pool``'s KV."""

    def __init__(self, driver: StepDriver, pool: KVPool, timeout_s: float) -> None:
        self.driver = driver
        self.pool = pool
        self.timeout_s = timeout_s
        self.sender = KVSender(timeout_s)
        self.counters = TransferCounters()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._peers: dict[str, zmq.Socket[bytes]] = {}  # decode hand-off address -> DEALER
        self.routes: dict[str, messages.PDRoute] = {}  # rid -> its pair, while it runs here
        self.announced: dict[str, _Announced] = {}  # room -> its hand-off, unanswered
        self.sending: dict[str, str] = {}  # transfer id -> rid, while its KV moves

    def add(self, msg: messages.TokenizedRequest) -> messages.TokenItem | None:
        if msg.pd is None or not msg.pd.decode:
            return rejected(msg.rid, "a prefill server serves only requests with pd.decode")
        error = self.driver.add(msg)
        if error is None:
            self.routes[msg.rid] = msg.pd
        return error

    def abort(self, rid: str) -> None:
        self.routes.pop(rid, None)
        for room, out in list(self.announced.items()):
            if out.rid == rid:
                del self.announced[room]
                self._send(out.peer, pd_wire.HandoffCancel(room, "aborted on the prefill server"))
        for transfer_id, sent in list(self.sending.items()):
            if sent == rid:  # its pages were released with the abort; its result is ignored
                del self.sending[transfer_id]

    def after_step(self, items: list[messages.TokenItem]) -> list[messages.TokenItem]:
        out: list[messages.TokenItem] = []
        for item in items:
            route = self.routes.get(item.rid) if item.finish_reason else None
            if route is not None and item.token_ids:  # it ended with its first token
                del self.routes[item.rid]
                first, reason = item.token_ids[0], item.finish_reason
                self._send(route.decode, pd_wire.Handoff(
                    route.room, item.rid, [], first, self.pool.page_size, 0, reason
                ))  # fmt: skip
        handed_off, self.driver.handed_off = self.driver.handed_off, []
        for rid in handed_off:
            out += self._announce(rid)
        out += self._answers()
        out += self._acknowledged()
        now = time.monotonic()
        for room, late in list(self.announced.items()):
            if now >= late.deadline:
                del self.announced[room]
                why = f"the decode server {late.peer} did not answer the hand-off"
                self._send(late.peer, pd_wire.HandoffCancel(room, why))
                out.append(self._fail(late.rid, f"{why} within {self.timeout_s:g} s"))
        return out

    def wait_ms(self, timeout_ms: int) -> int:
        deadlines = (a.deadline for a in self.announced.values())
        return wait_ms(timeout_ms, deadlines, spin=bool(self.sender.in_flight()))

    def sockets(self) -> list[zmq.Socket[bytes]]:
        return list(self._peers.values())

    def stats(self) -> messages.TransferStats:
        held = self.driver.core.held_for_transfer().values()
        return self.counters.snapshot(
            len(self.announced) + len(self.sending), sum(len(h.pages) for h in held)
        )

    def close(self) -> None:
        self.sender.close()
        for sock in self._peers.values():
            sock.close(linger=0)
        self._ctx.term()

    def _announce(self, rid: str) -> list[messages.TokenItem]:
        """Tell ``rid``'s decode server that its KV is ready."""
        route = self.routes.pop(rid, None)
        transfer = self.driver.core.transfer(rid)
        if route is None or transfer is None:
            return []
        handoff = pd_wire.Handoff(
            route.room,
            rid,
            list(transfer.prompt),
            transfer.first_token,
            self.pool.page_size,
            len(transfer.pages),
        )
        if not self._send(route.decode, handoff):
            return [self._fail(rid, f"the decode server {route.decode} takes no hand-offs now")]
        deadline = time.monotonic() + self.timeout_s
        self.announced[route.room] = _Announced(rid, route.decode, transfer, deadline)
        log.debug("rid %s handed off to %s as room %s", rid, route.decode, route.room)
        return []

    def _answers(self) -> list[messages.TokenItem]:
        """Start the transfer of every hand-off the decode server answered."""
        out = []
        for sock in self._peers.values():
            while True:
                try:
                    msg = pd_wire.decode(sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if not isinstance(msg, pd_wire.HandoffReply):
                    log.error("unexpected hand-off message %s", type(msg).__name__)
                    continue
                announced = self.announced.pop(msg.room, None)
                if announced is not None:  # else aborted here, or timed out, meanwhile
                    out += self._start(announced, msg)
        return out

    def _start(self, out: _Announced, reply: pd_wire.HandoffReply) -> list[messages.TokenItem]:
        rid, transfer = out.rid, out.transfer
        if not reply.ok:
            return [self._fail(rid, f"the decode server refused the hand-off: {reply.detail}")]
        pages = transfer.pages[reply.first :]
        if reply.num_pages != len(pages):
            why = f"the decode server expects {reply.num_pages} pages, {len(pages)} are left"
            return [self._fail(rid, why)]
        if not pages:  # its prefix cache held every page: nothing to send
            self.driver.core.transfer_done(rid)
            return [self._handed_off(rid)]
        n_tokens = transfer.prompt_len - reply.first * self.pool.page_size
        try:
            self.sender.send(
                reply.kv_address, reply.transfer_id, self.pool, pages, n_tokens, reply.kv_device
            )
        except (ValueError, zmq.ZMQError) as exc:
            return [self._fail(rid, f"cannot send the KV to {reply.kv_address}: {exc}")]
        self.sending[reply.transfer_id] = rid
        return []

    def _acknowledged(self) -> list[messages.TokenItem]:
        """End every request whose transfer ended: its pages are released either way."""
        out = []
        for result in self.sender.poll():
            self.counters.count(result)
            rid = self.sending.pop(result.transfer_id, None)
            if rid is None:
                continue
            if result.ok:
                self.driver.core.transfer_done(rid)
                log.debug("rid %s: %d KV bytes in %.4f s", rid, result.nbytes, result.seconds)
                out.append(self._handed_off(rid))
            else:
                why = f"the KV transfer failed ({result.status}): {result.detail}"
                out.append(self._fail(rid, why))
        return out

    def _handed_off(self, rid: str) -> messages.TokenItem:
        return messages.TokenItem(
            rid=rid, token_ids=[], token_times=[], finish_reason="handoff", finished=time.time()
        )

    def _fail(self, rid: str, why: str) -> messages.TokenItem:
        self.driver.abort(rid, why)
        log.warning("rid %s: %s", rid, why)
        return rejected(rid, why, FAILED)

    def _send(self, peer: str, msg: pd_wire.ControlMessage) -> bool:
        """Queue ``msg`` to the decode server at ``peer``; False if its queue is full or the
        address is not one."""
        sock = self._peers.get(peer)
        try:
            if sock is None:
                sock = self._connect(peer)
            sock.send(pd_wire.encode(msg), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.warning("cannot send a hand-off message to %s: %s", peer, exc)
            return False
        return True

    def _connect(self, peer: str) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(peer)
        except zmq.ZMQError:
            sock.close()
            raise
        self._peers[peer] = sock
        return sock
