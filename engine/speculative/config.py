"""``engine serve --speculative``: which drafter proposes the tokens the model verifies.

``none`` drafts nothing (plain decoding). ``ngram`` is prompt lookup
(``core.scheduler.drafter.NgramDrafter``): the tokens that followed the latest
earlier occurrence of the request's last ``ngram_max`` .. ``ngram_min`` tokens
in its prompt and output. ``self`` drafts with the served model's own first
``--draft-layers`` layers (``engine.speculative.self_draft``: an early exit,
a model-based drafter with no second checkpoint). ``synthetic`` drafts ``K`` tokens every time and
accepts them at ``--acceptance-rate`` (required: one rate, or ``K``
per-position rates), whatever the model says (``engine.speculative.synthetic``):
for measuring the verify step with dummy weights. How many tokens a draft holds
at most is the core's ``num_draft_tokens`` (``--num-draft-tokens``), ``K``;
left out, the number of per-position rates given, else ``DEFAULT_DRAFT_TOKENS``.
Without a drafter the core drafts nothing, whatever ``num_draft_tokens`` says
(scheduler rank 0 logs a warning).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from core.scheduler import SchedulerConfig
from core.settings import positive_int, setting
from engine.speculative.synthetic import SyntheticAcceptance, check_rates, parse_rates

if TYPE_CHECKING:
    from core.scheduler.drafter import Drafter
    from engine.models.llama import LlamaForCausalLM

METHODS = ("none", "ngram", "self", "synthetic")
DEFAULT_DRAFT_TOKENS = 4


@dataclass(frozen=True)
class SpeculativeConfig:
    """The drafter of scheduler rank 0 (the other ranks follow the plans it makes) and, for
    ``synthetic``, the rule that accepts its drafts."""

    method: str = setting(
        "none",
        "speculative decoding: none; ngram (prompt lookup: drafts the tokens that followed "
        "the last n-gram's earlier occurrence); self (the served model's first --draft-layers "
        "layers, greedy: an early exit); or synthetic (drafts K tokens every time and "
        "accepts them at --acceptance-rate, whatever the model says: measures the verify step, "
        f"e.g. with dummy weights); --num-draft-tokens K at most, {DEFAULT_DRAFT_TOKENS} when "
        "left out",
        flag="--speculative",
        choices=METHODS,
    )
    ngram_max: int = setting(3, "ngram: the longest n-gram looked up", parse=positive_int)
    ngram_min: int = setting(1, "ngram: the shortest n-gram looked up", parse=positive_int)
    draft_layers: int | None = setting(
        None,
        "self (and required by it): how many of the model's first layers draft (then its final "
        "norm and LM head); fewer draft faster, more are accepted more often",
        parse=positive_int,
    )
    acceptance_rate: tuple[float, ...] | None = setting(
        None,
        "synthetic (and required by it): the probability that a draft token is accepted when "
        "the ones before it were, one rate for every position or K comma-separated rates, each "
        "in [0, 1] (K, when --num-draft-tokens is left out)",
        parse=parse_rates,
        metavar="RATE[,RATE...]",
    )

    @property
    def on(self) -> bool:
        return self.method != "none"

    def check(self, scheduler: SchedulerConfig, k_given: bool) -> SchedulerConfig:
        """``scheduler`` with the draft length this method needs (``k_given``: whether
        ``--num-draft-tokens`` was given); ``ValueError`` on a combination that cannot run."""
        if self.method not in METHODS:
            raise ValueError(f"unknown --speculative {self.method!r}; known: {', '.join(METHODS)}")
        synthetic = self.method == "synthetic"
        rates = self.acceptance_rate
        if rates is not None and not synthetic:
            raise ValueError(
                "--acceptance-rate sets the acceptance of --speculative synthetic, "
                f"not of --speculative {self.method}"
            )
        if (self.draft_layers is not None) != (self.method == "self"):
            raise ValueError(
                "--draft-layers N goes with --speculative self (the model's first N layers "
                f"draft), got --speculative {self.method}"
                + ("" if self.draft_layers is not None else " without --draft-layers")
            )
        if not self.on:  # the core drafts nothing without a drafter, whatever its length
            return scheduler
        if synthetic and rates is None:
            raise ValueError(
                "--speculative synthetic needs --acceptance-rate: one rate for every draft "
                "position, or K comma-separated per-position rates"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"--ngram-min {self.ngram_min} and --ngram-max {self.ngram_max} must satisfy "
                "1 <= min <= max"
            )
        if not k_given:
            k = len(rates) if rates is not None and len(rates) > 1 else DEFAULT_DRAFT_TOKENS
            scheduler = replace(scheduler, num_draft_tokens=k)
        k = scheduler.num_draft_tokens
        if k < 1:
            raise ValueError(f"--speculative {self.method} needs --num-draft-tokens >= 1, got {k}")
        if rates is not None:
            check_rates(rates, k)
        return scheduler

    def drafter(
        self, model: LlamaForCausalLM | None = None, max_running: int = 1
    ) -> Drafter | None:
        """The drafter the core calls when it places a decoding request (None: no drafts);
        ``self`` drafts with ``model`` (rank 0's), keeping ``max_running`` requests' caches."""
        if not self.on:
            return None
        from core.scheduler.drafter import NgramDrafter, RepeatDrafter

        if self.method == "ngram":
            return NgramDrafter(max_ngram=self.ngram_max, min_ngram=self.ngram_min)
        if self.method == "self":
            from engine.speculative.self_draft import SelfDrafter

            if model is None or self.draft_layers is None:
                raise ValueError("--speculative self drafts with the served model's layers")
            return SelfDrafter(model, self.draft_layers, max_running)
        return RepeatDrafter()

    def acceptance(self) -> SyntheticAcceptance | None:
        """The rule that decides the accepted draft tokens in place of the model's (None: the
        standard rule, ``engine.sampling.verify``)."""
        if self.method != "synthetic" or self.acceptance_rate is None:
            return None
        return SyntheticAcceptance(self.acceptance_rate)

    def card(self, scheduler: SchedulerConfig) -> dict[str, object]:
        """What the model card says of it."""
        if not self.on:
            return {"method": "none"}
        out: dict[str, object] = {
            "method": self.method,
            "num_draft_tokens": scheduler.num_draft_tokens,
        }
        if self.method == "synthetic":
            return out | {"acceptance_rate": list(self.acceptance_rate or ())}
        if self.method == "self":
            return out | {"draft_layers": self.draft_layers}
        return out | {"ngram_max": self.ngram_max, "ngram_min": self.ngram_min}
