"""The scheduler's decisions and their outcomes: plain, serializable values.

A ``Plan`` is everything one model step needs to know: which requests prefill
which token span, which requests decode one token (and verify draft tokens),
and the page table of each. Rank 0 broadcasts it to the other tensor-parallel
ranks; a run can be logged and replayed from it. ``complete(plan, tokens)``
turns the sampled tokens into ``Event`` values.

Input tokens. Let ``sequence`` be a request's prompt followed by the output
tokens of the plans completed so far (what ``TokenOut`` events delivered). A
prefill chunk feeds ``sequence[start : start + length]``, all known. A decode
slot at ``position`` feeds ``sequence[position]`` when ``position <
len(sequence)``; when ``position == len(sequence)`` its token is the one the
plan still in flight samples for the same request (overlap scheduling: the
engine reads it on the device from that plan's sampled tokens). A slot is never
further ahead than that.

Draft tokens (speculative decoding). A decode slot's ``draft`` is fed at
positions ``position + 1 .. position + len(draft)``, after the slot's own
token, and the step samples one token after each fed position
(``len(draft) + 1``). The tokens the engine reports for the slot are the
verified ones: the draft's accepted prefix followed by the model's own next
token (1 to ``len(draft) + 1`` tokens). A slot with a draft is its request's
last one in flight: the next waits for its completion, since its position
depends on how many draft tokens are accepted; so the plan in flight that
samples a slot's input token (``position == len(sequence)``) carries no draft
for that request and samples exactly that one token. The KV of rejected draft
positions is garbage; later slots overwrite it.

Copies (the host KV tier, ``core.scheduler.host_tier``). A plan's ``writes``
copy device pages to host slots, its ``loads`` host slots to device pages. The
engine's contract, which the scheduler's decisions rely on:

1. plans' copies run in plan order (all of plan N's before any of plan N+1's);
2. within a plan, every write completes before any load starts, and every
   load before the plan's first read of its KV (its attention), so a device
   page that a write of plan N copies out may be handed out (loaded into,
   or written by the compute) in plan N itself;
3. the copies of one list may run in any order: no two writes share a host
   slot and no two loads share a device page.

Pages that copies touch are never used by a plan still in flight: writes read
cache pages that no outstanding plan writes, loads fill pages that were free
or just evicted. A plan may carry copies and no model work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

__all__ = [
    "PLACEHOLDER_TOKEN",
    "Blocked",
    "DecodeRun",
    "DecodeSlot",
    "Event",
    "FinishReason",
    "Finished",
    "Plan",
    "Preempted",
    "PrefillChunk",
    "Receive",
    "TokenOut",
    "Transfer",
]

PLACEHOLDER_TOKEN = -1  # the token recorded when the caller passes no tokens (simulation)


class FinishReason(StrEnum):
    LENGTH = "length"  # max_new_tokens reached
    STOP = "stop"  # a stop token (EOS or a user stop id) was sampled
    ABORT = "abort"  # aborted by the client or the server
    HANDOFF = "handoff"  # prefill role: its first token is out, its KV goes to a decode instance


class Blocked(StrEnum):
    """Why waiting requests were not admitted at a step (``NONE``: nothing was held back)."""

    NONE = ""
    KV_MEMORY = "kv_memory"  # the next request's pages (plus the decode reservation) do not fit
    RUNNING_CAP = "running_cap"  # ``max_running`` requests hold KV already
    PREFILL_BUDGET = "prefill_budget"  # the step's prefill token budget is spent


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """Compute the KV of positions ``[start, start + length)`` of a request's sequence.

    ``samples`` is true for the last chunk of a prefill: the model samples the
    request's next token from the logits of its last position.
    """

    rid: str
    start: int
    length: int
    samples: bool
    pages: tuple[int, ...]


class DecodeSlot(NamedTuple):
    """Feed the request's token at ``position`` (see the module doc), then its ``draft`` tokens,
    and sample one token after each (``len(draft) + 1``). A named tuple: the scheduler makes
    one per decoding request and step, and a tuple is the cheapest immutable value to make."""

    rid: str
    position: int
    pages: tuple[int, ...]
    draft: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """One scheduler step. Empty when there is nothing to run."""

    step: int
    prefill: tuple[PrefillChunk, ...] = ()
    decode: tuple[DecodeSlot, ...] = ()
    preempted: tuple[str, ...] = ()  # sent back to waiting at this step
    aborted: tuple[str, ...] = ()  # released at this step
    blocked: Blocked = Blocked.NONE
    writes: tuple[tuple[int, int], ...] = ()  # (device page, host slot), before the loads
    loads: tuple[tuple[int, int], ...] = ()  # (host slot, device page), before the compute

    @property
    def has_copies(self) -> bool:
        return bool(self.writes or self.loads)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.length for c in self.prefill)

    @property
    def num_draft_tokens(self) -> int:
        """Draft tokens the decode slots feed (speculative decoding)."""
        return sum(len(d.draft) for d in self.decode)

    @property
    def num_decode_tokens(self) -> int:
        """Positions the decode slots compute: one per slot plus its draft tokens."""
        return len(self.decode) + self.num_draft_tokens

    @property
    def batch_size(self) -> int:
        return len(self.prefill) + len(self.decode)

    @property
    def has_model_work(self) -> bool:
        return bool(self.prefill or self.decode)

    def sampling_rids(self) -> list[str]:
        """Requests that get a token from this step, in batch order."""
        return [c.rid for c in self.prefill if c.samples] + [d.rid for d in self.decode]

    def to_dict(self) -> dict[str, Any]:
        """A msgpack/JSON-friendly form (lists and scalars only).

        A decode slot is ``[rid, position, pages, draft]``, or ``[rid, position,
        pages]`` when its draft is empty (the form of plans without drafts is unchanged).
        """
        return {
            "step": self.step,
            "prefill": [[c.rid, c.start, c.length, c.samples, list(c.pages)] for c in self.prefill],
            "decode": [
                [d.rid, d.position, list(d.pages), list(d.draft)]
                if d.draft
                else [d.rid, d.position, list(d.pages)]
                for d in self.decode
            ],
            "preempted": list(self.preempted),
            "aborted": list(self.aborted),
            "blocked": self.blocked.value,
            "writes": [list(w) for w in self.writes],
            "loads": [list(c) for c in self.loads],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Plan:
        return Plan(
            step=int(d["step"]),
            prefill=tuple(
                PrefillChunk(rid, start, length, bool(samples), tuple(pages))
                for rid, start, length, samples, pages in d["prefill"]
            ),
            decode=tuple(
                DecodeSlot(e[0], e[1], tuple(e[2]), tuple(e[3]) if len(e) > 3 else ())
                for e in d["decode"]
            ),
            preempted=tuple(d["preempted"]),
            aborted=tuple(d["aborted"]),
            blocked=Blocked(d.get("blocked", "")),
            writes=tuple((int(a), int(b)) for a, b in d.get("writes", ())),
            loads=tuple((int(a), int(b)) for a, b in d.get("loads", ())),
        )


@dataclass(frozen=True, slots=True)
class TokenOut:
    """A request produced ``token``; ``first`` marks its first output token."""

    rid: str
    token: int
    first: bool


@dataclass(frozen=True, slots=True)
class Finished:
    rid: str
    reason: FinishReason
    num_output_tokens: int


@dataclass(frozen=True, slots=True)
class Preempted:
    """The request lost its KV pages and went back to waiting (recompute)."""

    rid: str


Event = TokenOut | Finished | Preempted


@dataclass(frozen=True, slots=True)
class Transfer:
    """What a prefill-role scheduler hands off (``core.scheduler.handoff``): page ``i`` of
    ``pages`` holds the KV of prompt positions ``[i * page_size, (i + 1) * page_size)``;
    ``prompt`` is empty when the request has no token ids (hash keys, simulation);
    ``max_new_tokens`` is the request's own limit, the first token included."""

    rid: str
    pages: tuple[int, ...]
    prompt_len: int
    prompt: tuple[int, ...]
    first_token: int
    max_new_tokens: int


@dataclass(frozen=True, slots=True)
class Receive:
    """Where a decode-role scheduler takes a request's KV: fill ``pages`` with the prompt's
    pages from index ``first`` on (``Transfer.pages[first:]``, one for one); the ``first``
    before them its prefix cache holds already."""

    rid: str
    first: int
    pages: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """``k`` identical pure-decode steps advanced at once (see ``Scheduler.advance_decode``).

    The run places steps ``first_step .. first_step + k - 1`` and completes
    ``k`` plans, each giving every request in ``rids`` one token. Without a
    plan in flight at the call those are the run's own steps; with one (overlap
    scheduling) they are that plan and the run's first ``k - 1`` steps, and the
    run's last step stays in flight as ``in_flight``, for the caller to
    complete like any plan.

    ``new_pages[i]`` is the number of pages allocated at step ``i`` of the run;
    ``context_tokens`` is the KV positions the batch holds or has planned before
    the first step (its attention reads ``context_tokens + len(rids)``, then one
    more per request each step).
    """

    first_step: int
    k: int
    rids: tuple[str, ...]
    context_tokens: int
    new_pages: tuple[int, ...] = field(default=())
    blocked: Blocked = Blocked.NONE  # why the waiting requests stayed out (as ``Plan.blocked``)
    in_flight: Plan | None = None
