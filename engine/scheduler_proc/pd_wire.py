"""What a prefill server's scheduler and a decode server's say to each other (msgpack).

The control plane of prefill/decode disaggregation (``engine.scheduler_proc.pd``): a
DEALER socket of the prefill scheduler per decode server, connected to the decode
scheduler's ROUTER (its ``handoff_addr``). The KV itself moves on its own connection
(``engine.kvcache.transfer``)::

    prefill scheduler                                    decode scheduler
    Handoff(room, prompt, first token, pages) ─────────► pairs it with its own request of
                                                         the room, queues it, admits it
    KV to kv_address as transfer_id  ◄────────────────── HandoffReply(room, ok, transfer_id,
                                                           first, num_pages, kv_address)
    HandoffCancel(room) ───────────────────────────────► the request fails there
"""

from __future__ import annotations

import logging

import msgspec

log = logging.getLogger(__name__)


class Handoff(msgspec.Struct, tag=True, frozen=True):
    """The request of ``room`` (``rid`` on the prefill server, for logs) was prefilled:
    ``prompt`` its token ids, ``first_token`` the token sampled after it, ``num_pages`` pages
    of ``page_size`` hold its prompt's KV. With ``finish_reason`` it ended with that token
    (a stop token, or a limit of one): nothing to transfer, the decode server ends it too."""

    room: str
    rid: str
    prompt: list[int]
    first_token: int
    page_size: int
    num_pages: int
    finish_reason: str | None = None


class HandoffReply(msgspec.Struct, tag=True, frozen=True):
    """The decode server's answer for ``room``: ``ok``, then send the prompt's pages from index
    ``first`` on (``num_pages`` of them: the ones before are in its prefix cache; 0: none to
    send) to ``kv_address`` as ``transfer_id``; else why not (``detail``). ``kv_device``: the
    GPU its pool is on, for CUDA IPC from a prefill server on the same one (empty: none)."""

    room: str
    ok: bool
    detail: str = ""
    transfer_id: str = ""
    first: int = 0
    num_pages: int = 0
    kv_address: str = ""
    kv_device: str = ""


class HandoffCancel(msgspec.Struct, tag=True, frozen=True):
    """The prefill server gave up the request of ``room`` (``reason``)."""

    room: str
    reason: str


ControlMessage = Handoff | HandoffReply | HandoffCancel

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[ControlMessage] = msgspec.msgpack.Decoder(ControlMessage)


def encode(msg: ControlMessage) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> ControlMessage | None:
    """The message in ``data``, or None for bytes that are not one (logged)."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        log.error("dropped an undecodable hand-off message: %s", exc)
        return None
