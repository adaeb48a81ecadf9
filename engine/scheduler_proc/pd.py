"""Prefill/decode disaggregation in the scheduler loop: what both roles' hand-offs share.

A request of a prefill/decode pair reaches both servers (``engine router --prefill ...
--decode ...`` sends it to each, with the same ``PDRoute.room``). The prefill server
computes its prompt and first token and hands it off; the decode server decodes the rest
and streams every token, the first included, to its client. Who sends what::

    prefill scheduler (pd_prefill)                 decode scheduler (pd_decode)
    core: Finished(rid, HANDOFF, 1)                its frontend's request of the room
    Handoff(room, prompt, first token) ───────────► waits for its other half (either
                                                    comes first), add_incoming, sends
                                                    the first token to its client
                                                    core admits it: take_receives,
    KVSender.send(Transfer.pages[first:]) ◄─────── KVReceiver.expect, HandoffReply
    (pages held until acknowledged)  ─────────────► KVReceiver.poll: kv_landed, it decodes
    KVSender.poll: transfer_done, the prefill
    request ends (finish reason ``handoff``)

Every wait has the deadline ``--pd-timeout``: a request's other half, the decode server's
answer, the KV's acknowledgment, its landing. Whatever fails or times out fails its request
on that side (an error item: an HTTP error, or an SSE ``error`` event) and releases its
pages (``abort``); the prefill side tells the decode side (``HandoffCancel``), a refused or
unacknowledged transfer tells the prefill side. Both run in the scheduler's loop between
steps and never block it: sockets are read without waiting, and the loop's idle wait
wakes on the control sockets (``sockets``) or at the next deadline (``wait_ms``).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import zmq

from engine.ipc import messages
from engine.kvcache.transfer_wire import TransferResult

SPIN_MS = 2  # the loop's wait while KV moves on sockets it cannot poll (the transfer's own)


class Handoffs(Protocol):
    """One role's side of the hand-offs, as the scheduler loop drives it; ``counters``: its
    transfers so far."""

    counters: TransferCounters

    def add(self, msg: messages.TokenizedRequest) -> messages.TokenItem | None:
        """A request from this server's frontend; an item for its client now, if any."""

    def abort(self, rid: str) -> None:
        """``rid`` was aborted here (the core is told apart): stop its hand-off."""

    def after_step(self, items: list[messages.TokenItem]) -> list[messages.TokenItem]:
        """After a step (``items``: its outputs): move the hand-offs on; new items to send."""

    def wait_ms(self, timeout_ms: int) -> int:
        """How long the loop may block on its sockets, at most ``timeout_ms``."""

    def sockets(self) -> list[zmq.Socket[bytes]]:
        """The sockets whose messages should wake an idle loop."""

    def stats(self) -> messages.TransferStats:
        """The transfers so far, for ``/metrics``."""

    def close(self) -> None:
        """Close every socket."""


@dataclass
class TransferCounters:
    """Ended transfers by status, and the bytes and seconds of the ``ok`` ones (and how many
    of those went through CUDA IPC)."""

    ended: Counter[str] = field(default_factory=Counter)
    nbytes: int = 0
    seconds: float = 0.0
    cuda_ipc: int = 0

    def count(self, result: TransferResult) -> None:
        self.ended[result.status] += 1
        if result.ok:
            self.nbytes += result.nbytes
            self.seconds += result.seconds
            self.cuda_ipc += result.cuda_ipc

    def snapshot(self, open_handoffs: int, pages: int) -> messages.TransferStats:
        return messages.TransferStats(
            ended=dict(self.ended),
            nbytes=self.nbytes,
            seconds=self.seconds,
            cuda_ipc=self.cuda_ipc,
            open_handoffs=open_handoffs,
            pages_in_transfer=pages,
        )


def wait_ms(timeout_ms: int, deadlines: Iterable[float], spin: bool) -> int:
    """``timeout_ms``, cut to ``SPIN_MS`` while ``spin`` and to the nearest of ``deadlines``
    (``time.monotonic`` values)."""
    if spin:
        return min(timeout_ms, SPIN_MS)
    nearest = min(deadlines, default=None)
    if nearest is None:
        return timeout_ms
    return min(timeout_ms, max(1, math.ceil((nearest - time.monotonic()) * 1000)))
