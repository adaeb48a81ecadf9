"""What speculative decoding achieved in the step loop: drafts proposed and accepted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from core.scheduler import Plan
from engine.ipc.messages import SpeculativeStats


def accepted_tokens(plan: Plan, tokens: Mapping[str, int | Sequence[int]]) -> list[int]:
    """Per decode slot of ``plan`` with a draft, the draft tokens the model accepted (its
    verified tokens but the last, which the model drew itself)."""
    out = []
    for slot in plan.decode:
        if slot.draft:
            verified = tokens[slot.rid]
            out.append(len(verified) - 1 if isinstance(verified, Sequence) else 0)
    return out


class DraftCounters:
    """The running totals behind ``SpeculativeStats`` (what ``/metrics`` shows)."""

    def __init__(self) -> None:
        self.verify_slots = 0
        self.undrafted_slots = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_lengths: list[int] = []
        self.tested_per_position: list[int] = []

    def count(self, plan: Plan, accepted: Sequence[int]) -> None:
        """Add ``plan``'s verify slots, ``accepted`` as ``accepted_tokens`` gave them, and its
        decode slots that carried no draft."""
        self.verify_slots += len(accepted)
        self.undrafted_slots += len(plan.decode) - len(accepted)
        self.draft_tokens += plan.num_draft_tokens
        self.accepted_tokens += sum(accepted)
        drafts = (len(slot.draft) for slot in plan.decode if slot.draft)
        for n, length in zip(accepted, drafts, strict=True):
            _add(self.accepted_lengths, n)
            for i in range(min(n + 1, length)):  # tested: up to the first rejection
                _add(self.tested_per_position, i)

    def snapshot(self) -> SpeculativeStats:
        return SpeculativeStats(
            self.verify_slots,
            self.draft_tokens,
            self.accepted_tokens,
            list(self.accepted_lengths),
            self.undrafted_slots,
            list(self.tested_per_position),
        )


def _add(counts: list[int], index: int) -> None:
    if index >= len(counts):
        counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += 1
