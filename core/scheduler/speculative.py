"""Speculative decoding in the scheduler: the draft a slot may carry, what its verification
keeps, and the rollback of the rejected positions.

A decoding request placed with ``k`` draft tokens at ``position`` plans
``1 + k`` positions and holds pages for them. The step's verified tokens for
it are ``m`` tokens, ``1 <= m <= k + 1``: ``m - 1`` accepted draft tokens and
the model's own next one. They are delivered one by one (a stop token or the
output limit ends the request there, the rest are dropped), then::

    num_planned = position + kept        (positions whose KV holds verified tokens)
    pages       = pages_for(num_planned) (the pages past it go back to the pool)

The KV at the rejected positions is garbage that the next slots overwrite;
prefix cache keys come from the verified output only (``KVMemory.take``), so
no cache page is ever keyed by a draft token.

Limits on a draft (``draft_limit``): at most ``num_draft_tokens``; no output
past ``max_new_tokens``; pages that are free or evictable (unreferenced cache)
once every decoding request has its one mandatory page, so a draft never
preempts, never makes a request sit out and never evicts a referenced page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from core.scheduler.drafter import Drafter
from core.scheduler.memory import KVMemory
from core.scheduler.pages import pages_for
from core.scheduler.plan import PLACEHOLDER_TOKEN, DecodeSlot, Plan
from core.scheduler.request import Request

Sampled = int | Sequence[int]  # a slot's sampled token, or its verified tokens (drafts)


def draft_limit(req: Request, most: int, page_size: int, spare_pages: int) -> int:
    """The most draft tokens the slot being placed for ``req`` (at ``req.num_planned``, its
    page given) may carry: ``most``, the output it may still produce after the slot's own
    token, and what its pages plus ``spare_pages`` more hold."""
    position = req.num_planned
    left = req.max_new_tokens - (position - req.prompt_len + 1) - 1  # planned_outputs, inlined
    room = (len(req.pages) + spare_pages) * page_size - position - 1
    return max(0, min(most, left, room))


def give_drafts(
    placed: list[Request], drafter: Drafter, memory: KVMemory, most: int
) -> list[tuple[int, ...]]:
    """The draft of each placed request's slot, with pages for it; after every placed
    request has its mandatory page, from free or evictable pages only."""
    ps = memory.page_size
    drafts: list[tuple[int, ...]] = []
    for req in placed:
        k = draft_limit(req, most, ps, memory.num_free + memory.evictable)
        draft: tuple[int, ...] = ()
        if k > 0:
            unknown = int(req.num_planned >= req.fill_len)  # the plan in flight samples it
            draft = tuple(drafter.propose(req, k + unknown))[unknown : unknown + k]
            need = pages_for(req.num_planned + 1 + len(draft), ps) - len(req.pages)
            if need > 0:
                memory.make_room(need)
                memory.add_pages(req, need)
        drafts.append(draft)
    return drafts


def check_results(
    plan: Plan, tokens: Mapping[str, Sampled] | None, accepted: Mapping[str, int] | None
) -> None:
    """Raise ``ValueError`` unless each decode slot's result fits it: one token (an int), or for
    a slot with a draft 1 to ``len(draft) + 1`` verified tokens that begin with the accepted
    draft tokens; accepted counts of 0 to ``len(draft)``."""
    if tokens is not None:
        for slot in plan.decode:
            value = tokens.get(slot.rid)
            draft = slot.draft
            if value is None or type(value) is int:  # one token (for a draft: none accepted)
                continue
            if not draft or not isinstance(value, Sequence):
                raise ValueError(f"{slot.rid}: a slot without draft tokens takes one token (an"
                                 f" int), got {value!r}")  # fmt: skip
            if not 1 <= len(value) <= len(draft) + 1:
                raise ValueError(
                    f"{slot.rid}: {len(value)} verified tokens for a slot with"
                    f" {len(draft)} draft tokens (1 to {len(draft) + 1})"
                )
            if list(value[:-1]) != list(draft[: len(value) - 1]):
                raise ValueError(
                    f"{slot.rid}: verified tokens {list(value)} do not begin with the accepted"
                    f" draft tokens {list(draft[: len(value) - 1])}"
                )
    if accepted:
        drafts = {slot.rid: len(slot.draft) for slot in plan.decode}
        for rid, count in accepted.items():
            if rid not in drafts or not 0 <= count <= drafts[rid]:
                raise ValueError(
                    f"{rid}: {count} accepted draft tokens for a slot with"
                    f" {drafts.get(rid, 'no')} draft tokens in step {plan.step}"
                )


def verified(
    slot: DecodeSlot, tokens: Mapping[str, Sampled] | None, accepted: Mapping[str, int] | None
) -> Sequence[int]:
    """The verified tokens of the draft-carrying ``slot`` (checked by ``check_results``);
    without tokens (simulation), ``accepted + 1`` placeholders."""
    if tokens is None:
        return (PLACEHOLDER_TOKEN,) * (1 + (accepted.get(slot.rid, 0) if accepted else 0))
    value = tokens[slot.rid]
    return value if isinstance(value, Sequence) else (value,)


def num_kept(req: Request, new: Sequence[int]) -> int:
    """How many of ``new`` the request keeps: up to its first stop token or its output limit."""
    room = req.max_new_tokens - len(req.output)
    for i, token in enumerate(new[:room]):
        if token in req.stop_token_ids:
            return i + 1
    return min(len(new), room)


def surplus_pages(req: Request, page_size: int) -> tuple[int, ...]:
    """Take from ``req`` the pages wholly past its ``num_planned`` positions (after a rollback)."""
    keep = pages_for(req.num_planned, page_size)
    assert keep >= req.num_shared_pages, "a rollback never reaches shared pages"
    surplus = req.pages[keep:]
    req.pages = req.pages[:keep]
    return surplus
