"""Typed messages between the serving processes, encoded with msgpack (never pickle).

Every message that concerns a request carries its ``rid``. The path of a request::

    frontend ──GenerateRequest──► tokenizer ──TokenizedRequest──► scheduler rank 0
    frontend ──AbortRequest─────► tokenizer ──AbortRequest──────► scheduler rank 0
    scheduler ──TokenBatch──► detokenizer ──TextBatch──► frontend
    detokenizer ──AbortRequest──► scheduler            (a stop string matched)
    tokenizer ──TextBatch(error)──► frontend           (the prompt was rejected)
    scheduler ──StatsUpdate──► frontend                (for /metrics)
    every child ──Ready──► launcher                    (after loading)

A request of a prefill/decode pair (``--role prefill|decode``) carries a ``PDRoute``
from the frontend to its scheduler; what the two schedulers say to each other is
``engine.scheduler_proc.pd_wire``'s.

That is ``--layout split``. With ``--layout frontend`` the frontend's own threads
tokenize and detokenize (no tokenizer or detokenizer process)::

    frontend ──TokenizedRequest, AbortRequest──► scheduler rank 0 ──TokenBatch──► frontend

With ``--layout inline`` scheduler rank 0 tokenizes and detokenizes between steps::

    frontend ──GenerateRequest, AbortRequest──► scheduler rank 0 ──TextBatch──► frontend

With several replicas the frontend names the ``replica`` of a request (and of
its abort) and the tokenizer worker sends it to that replica's scheduler; each
replica's scheduler and detokenizer form their own closed loop, and a
replica's scheduler names itself in its ``StatsUpdate``.
An abort travels through the same tokenizer worker as its request, so the
scheduler never sees an abort before the request it cancels.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import msgspec

from core.scheduler.config import SchedulerStats
from engine.sampling.logprobs import TokenLogprob
from engine.sampling.params import SamplingParams

log = logging.getLogger(__name__)


class ChatMessage(msgspec.Struct, frozen=True):
    role: str
    content: str


def new_rid() -> str:
    return uuid.uuid4().hex


class PDRoute(msgspec.Struct, frozen=True):
    """Where a request of a prefill/decode pair meets its other half: ``room`` names it on
    both servers (the router gives both the same); ``decode`` is the decode server's
    hand-off address, which the prefill server sends it to (empty on the decode server)."""

    room: str
    decode: str = ""


class GenerateRequest(msgspec.Struct, tag=True, kw_only=True):
    """A request as the frontend received it: text, chat messages or token ids.

    A new request gets a fresh ``rid`` and is ``received`` now unless they are given.
    """

    sampling: SamplingParams
    rid: str = msgspec.field(default_factory=new_rid)
    received: float = msgspec.field(default_factory=time.time)
    text: str | None = None
    messages: list[ChatMessage] | None = None
    input_ids: list[int] | None = None
    priority: int = 0
    max_tokens_explicit: bool = True  # False: shrink max_new_tokens to fit the context
    session: str | None = None  # a client's conversation (prompt_cache_key or user), for the router
    replica: int = 0  # the replica the frontend placed it on
    pd: PDRoute | None = None  # a request of a prefill/decode pair


class TokenizedRequest(msgspec.Struct, tag=True):
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    received: float
    tokenized: float
    priority: int = 0
    pd: PDRoute | None = None


class AbortRequest(msgspec.Struct, tag=True):
    rid: str
    reason: str = "client disconnected"
    replica: int = 0


class RequestOutput(msgspec.Struct, kw_only=True):
    """What a request produced so far: its tokens, how it ended, its counts and stage times.

    When the request asked for them, ``logprobs`` has one entry per token of
    ``token_ids``, and the first item carries ``prompt_logprobs``, one entry per
    prompt token.
    """

    rid: str
    token_ids: list[int] = []
    token_times: list[float] = []
    logprobs: list[TokenLogprob] = []
    prompt_logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tokenized: float | None = None
    first_scheduled: float | None = None
    finished: float | None = None

    def output_fields(self) -> dict[str, Any]:
        """The ``RequestOutput`` fields of this item, to build an item of another kind."""
        return {name: getattr(self, name) for name in RequestOutput.__struct_fields__}


class TokenItem(RequestOutput, kw_only=True):
    """New tokens of one request from one scheduler step (or its end).

    ``stop`` (the stop strings) rides along on the request's first item so the
    detokenizer needs no other channel. ``error`` set means the request was
    rejected and never ran, or failed (``error_status``: its HTTP status).
    """

    stop: list[str] | None = None
    error: str | None = None
    error_status: int = 400


class TokenBatch(msgspec.Struct, tag=True):
    items: list[TokenItem]


class TextItem(RequestOutput, kw_only=True):
    """New text of one request; ``token_ids`` are the tokens that produced it.

    ``pieces`` maps every token id its log-prob entries name to the token's
    bytes; ``prompt_text`` is the decoded prompt when ``prompt_logprobs`` is set.
    """

    text: str
    error: str | None = None
    error_status: int = 400
    pieces: dict[int, bytes] = {}
    prompt_text: str | None = None


class TextBatch(msgspec.Struct, tag=True):
    items: list[TextItem]


class SpeculativeStats(msgspec.Struct, frozen=True):
    """Speculative decoding so far: decode slots that verified a draft, draft tokens they
    proposed and the model accepted, ``accepted_lengths[n]``: the slots that accepted
    ``n`` draft tokens (``n`` from 0 to the longest draft), ``undrafted_slots``: decode
    slots the drafter gave no draft (a plain decode), and ``tested_per_position[i]``: the
    slots whose draft token ``i`` (from 0) was tested, its draft that long and every token
    before it accepted (so ``i``'s acceptance rate is the slots that accepted more than
    ``i`` over this, whatever the drafts' lengths)."""

    verify_slots: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_lengths: list[int] = []
    undrafted_slots: int = 0
    tested_per_position: list[int] = []


class TransferStats(msgspec.Struct, frozen=True):
    """KV transfers of a prefill or decode scheduler so far (``engine.scheduler_proc.pd``):
    ended transfers by status (``ok``, ``timeout``, ``refused``, ``mismatch``), the bytes
    and seconds of the ``ok`` ones (sent, or received), and now: the hand-offs open (waiting
    for their other half, an answer or their KV) and the pages held for transfer.
    ``cuda_ipc``: of the ``ok`` ones, those that went device to device through CUDA IPC."""

    ended: dict[str, int] = {}
    nbytes: int = 0
    seconds: float = 0.0
    cuda_ipc: int = 0
    open_handoffs: int = 0
    pages_in_transfer: int = 0


class StatsUpdate(msgspec.Struct, tag=True):
    """The scheduler core's counters at one moment, the preemptions so far, the time the
    runner spent loading KV from the host tier, (a speculating scheduler) its drafts and (a
    prefill or decode one) its KV transfers."""

    time: float
    stats: SchedulerStats
    num_preemptions: int = 0
    replica: int = 0
    host_load_s: float = 0.0
    speculative: SpeculativeStats | None = None
    transfers: TransferStats | None = None


class Ready(msgspec.Struct, tag=True):
    """A child finished loading; ``info`` holds what the launcher may need."""

    role: str
    rank: int
    pid: int
    replica: int = 0
    info: dict[str, Any] = {}


Message = (
    GenerateRequest | TokenizedRequest | AbortRequest | TokenBatch | TextBatch | StatsUpdate | Ready
)

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    """Decode one message; raises ``msgspec.DecodeError`` on bytes that are not one."""
    return _decoder.decode(data)


def try_decode(data: bytes) -> Message | None:
    """Decode one message, or log and return None for bytes that are not one."""
    try:
        return decode(data)
    except msgspec.DecodeError as exc:
        log.error("dropped an undecodable message: %s", exc)
        return None
