"""The simulator's drafter: placeholders on the share of decode slots the engine's drafter fills.

The engine's n-gram drafter proposes a draft only where it finds a match; a
slot without one is a plain decode. ``SharedDrafter`` proposes ``k``
placeholders (``core.scheduler.PlaceholderDrafter``) on a slot with
probability ``share`` (``AcceptanceModel.draft_share``), else none. The
choice is a hash of the run's seed, the request and its output length
(``sim.costs.acceptance.uniforms``, salted apart from the acceptance draws),
so it does not depend on batch order, replica placement or the loop.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from core.scheduler.drafter import PlaceholderDrafter
from core.scheduler.request import Request
from sim.costs.acceptance import uniforms

SALT = 0x5EED_D4AF
"""Mixed into the seed, so the draft choice is not the acceptance draw of the same position."""


class SharedDrafter:
    """A ``Drafter`` that drafts ``share`` of the decode slots (placeholders), deterministically;
    ``drafted`` and ``undrafted`` count its answers."""

    def __init__(self, share: float, seed: int = 0) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"draft share must be in [0, 1], got {share!r}")
        self.share = share
        self.seed = seed ^ SALT
        self.placeholders = PlaceholderDrafter()
        self.drafted = 0
        self.undrafted = 0

    def propose(self, req: Request, k: int) -> Sequence[int]:
        if self.drafts(req):
            self.drafted += 1
            return self.placeholders.propose(req, k)
        self.undrafted += 1
        return ()

    def drafts(self, req: Request) -> bool:
        """Whether ``req``'s slot at its current output length carries a draft."""
        if self.share >= 1.0:
            return True
        if self.share <= 0.0:
            return False
        key = np.array([zlib.crc32(req.rid.encode())], dtype=np.uint64)
        u = uniforms(self.seed, key, np.array([len(req.output)], dtype=np.uint64))
        return bool(u[0] < self.share)
