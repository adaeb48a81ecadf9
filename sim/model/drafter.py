"""The simulator's drafter: placeholders on the share of decode slots the engine's drafter fills.

The engine's n-gram drafter proposes a draft only where it finds a match; a
slot without one is a plain decode. ``SharedDrafter`` proposes ``k``
placeholders (``core.scheduler.PlaceholderDrafter``) on a slot with
probability ``share`` (``AcceptanceModel.draft_share``), else none. The
choice is a hash of the run's seed, the request and the position its slot
feeds (``req.num_planned``; ``sim.costs.acceptance.uniforms``, salted apart
from the acceptance draws), so it does not depend on batch order, replica
placement or the loop. Not the output length: with overlap, a slot placed
while the request's previous one is in flight has the same output length as
that one, and would repeat its choice.

A drafter that runs a model costs time (the engine's ``--speculative self``:
the served model's first layers, run in the scheduler's ``schedule`` call,
before the step is launched). With a ``price`` (seconds per draft token at a
request's context; ``self_draft_price``) the drafter adds up what its drafts
cost, and the scheduler loop takes that as scheduling time of the step
(``take_spent``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np

from core.scheduler.drafter import PlaceholderDrafter
from core.scheduler.request import Request
from core.scheduler.shape import StepShape
from sim.costs.acceptance import uniforms
from sim.costs.base import GpuCostModel

DraftPrice = Callable[[int], float]
"""Seconds a draft token costs a request at a context of that many tokens."""

SALT = 0x5EED_D4AF
"""Mixed into the seed, so the draft choice is not the acceptance draw of the same position."""


class SharedDrafter:
    """A ``Drafter`` that drafts ``share`` of the decode slots (placeholders), deterministically;
    ``drafted`` and ``undrafted`` count its answers."""

    def __init__(self, share: float, seed: int = 0, price: DraftPrice | None = None) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"draft share must be in [0, 1], got {share!r}")
        self.share = share
        self.seed = seed ^ SALT
        self.price = price
        self.placeholders = PlaceholderDrafter()
        self.drafted = 0
        self.undrafted = 0
        self.spent = 0.0  # seconds the drafts proposed since the last take_spent cost

    def propose(self, req: Request, k: int) -> Sequence[int]:
        if self.drafts(req):
            self.drafted += 1
            if self.price is not None:
                self.spent += k * self.price(req.num_planned)
            return self.placeholders.propose(req, k)
        self.undrafted += 1
        return ()

    def take_spent(self) -> float:
        """What the drafts proposed since the last call cost (then 0 again)."""
        spent, self.spent = self.spent, 0.0
        return spent

    def drafts(self, req: Request) -> bool:
        """Whether the slot being placed for ``req`` (at position ``req.num_planned``) carries
        a draft."""
        if self.share >= 1.0:
            return True
        if self.share <= 0.0:
            return False
        key = np.array([zlib.crc32(req.rid.encode())], dtype=np.uint64)
        u = uniforms(self.seed, key, np.array([req.num_planned], dtype=np.uint64))
        return bool(u[0] < self.share)


def self_draft_price(fraction: float, gpu: GpuCostModel) -> DraftPrice:
    """A self-draft's token: ``fraction`` (draft layers over the model's) of a batch-1 decode
    step at the request's context."""

    def price(context: int) -> float:
        return fraction * gpu.step_time(StepShape.decode(1, context + 1, context + 1))

    return price
