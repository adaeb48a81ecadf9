"""``engine serve --speculative``: which drafter proposes the tokens the model verifies.

``none`` drafts nothing (plain decoding). ``ngram`` is prompt lookup
(``core.scheduler.drafter.NgramDrafter``): the tokens that followed the latest
earlier occurrence of the request's last ``ngram_max`` .. ``ngram_min`` tokens
in its prompt and output. How many tokens a draft holds at most is the core's
``num_draft_tokens`` (``--num-draft-tokens``); with ``ngram`` and that left
out, ``DEFAULT_DRAFT_TOKENS``. Without a drafter the core drafts nothing, whatever
``num_draft_tokens`` says (scheduler rank 0 logs a warning).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from core.scheduler import SchedulerConfig
from core.settings import positive_int, setting

if TYPE_CHECKING:
    from core.scheduler.drafter import Drafter

METHODS = ("none", "ngram")
DEFAULT_DRAFT_TOKENS = 4


@dataclass(frozen=True)
class SpeculativeConfig:
    """The drafter of scheduler rank 0 (the other ranks follow the plans it makes)."""

    method: str = setting(
        "none",
        "speculative decoding: none, or ngram (prompt lookup: drafts the tokens that followed "
        f"the last n-gram's earlier occurrence; --num-draft-tokens at most, {DEFAULT_DRAFT_TOKENS} "
        "when left out)",
        flag="--speculative",
        choices=METHODS,
    )
    ngram_max: int = setting(3, "ngram: the longest n-gram looked up", parse=positive_int)
    ngram_min: int = setting(1, "ngram: the shortest n-gram looked up", parse=positive_int)

    @property
    def on(self) -> bool:
        return self.method != "none"

    def check(self, scheduler: SchedulerConfig, k_given: bool) -> SchedulerConfig:
        """``scheduler`` with the draft length this method needs (``k_given``: whether
        ``--num-draft-tokens`` was given); ``ValueError`` on a combination that cannot run."""
        if self.method not in METHODS:
            raise ValueError(f"unknown --speculative {self.method!r}; known: {', '.join(METHODS)}")
        k = scheduler.num_draft_tokens
        if not self.on:  # the core drafts nothing without a drafter, whatever its length
            return scheduler
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"--ngram-min {self.ngram_min} and --ngram-max {self.ngram_max} must satisfy "
                "1 <= min <= max"
            )
        if not k_given:
            return replace(scheduler, num_draft_tokens=DEFAULT_DRAFT_TOKENS)
        if k < 1:
            raise ValueError(f"--speculative {self.method} needs --num-draft-tokens >= 1, got {k}")
        return scheduler

    def drafter(self) -> Drafter | None:
        """The drafter the core calls when it places a decoding request (None: no drafts)."""
        if not self.on:
            return None
        from core.scheduler.drafter import NgramDrafter

        return NgramDrafter(max_ngram=self.ngram_max, min_ngram=self.ngram_min)

    def card(self, scheduler: SchedulerConfig) -> dict[str, object]:
        """What the model card says of it."""
        if not self.on:
            return {"method": "none"}
        return {
            "method": self.method,
            "num_draft_tokens": scheduler.num_draft_tokens,
            "ngram_max": self.ngram_max,
            "ngram_min": self.ngram_min,
        }
