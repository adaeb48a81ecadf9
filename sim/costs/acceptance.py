"""The acceptance model of speculative decoding: how many draft tokens a verify step keeps.

The simulator's drafter proposes placeholders (``core.scheduler.PlaceholderDrafter``);
how many of a slot's ``k`` draft tokens the target model accepts is drawn here,
and ``Scheduler.complete(plan, None, accepted=...)`` delivers that many plus one.
The model is per-position conditional rates::

    a_i = P(draft token i accepted | tokens 1 .. i-1 were)       i = 1 .. K

and a slot with ``k <= K`` drafts accepts ``n`` tokens where ``n`` is the
first ``i`` whose draw fails (``k`` if none does). ``empirical`` models draw
``n`` from a measured histogram of accepted lengths instead (``P(n)`` for
``n < k``, the rest of the mass at ``k``).

Not every decode slot carries a draft: the engine's n-gram drafter proposes
one only where it finds a match (a quarter of the slots of chat, most of those
of a copying prompt). ``draft_share`` is the share of decode slots that carry
one; the others decode plainly (``sim.model.drafter``). The histogram counts
verify slots only, so the rates are of drafted slots.

What informs it, never assumed, is read by ``sim.costs.acceptance_files``.

Draws are deterministic: each is a hash of the run's seed, the request and the
draft token's position (``uniforms``), so they do not depend on batch order,
replica placement or the loop: two configurations that place the same draft
draw the same acceptance (common random numbers for sweeps).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.scheduler.plan import Plan

DRAWS = ("rates", "empirical")
"""How a slot's accepted count is drawn: a chain of per-position rates, or the histogram."""
METRIC = "engine_spec_decode_accepted_length"
"""The engine's ``/metrics`` histogram of accepted draft tokens per verify slot."""


@dataclass(frozen=True, slots=True)
class AcceptanceModel:
    """Per-position acceptance rates ``a_1 .. a_K`` (``rates``), and the histogram of
    accepted lengths they came from when measured (``histogram[n]``: slots that accepted
    ``n``; ``empirical`` draws from it). ``geometric``: one rate for every position.
    ``draft_share``: the share of decode slots that carry a draft at all."""

    rates: tuple[float, ...]
    source: str
    histogram: tuple[int, ...] = ()
    tested: tuple[int, ...] = ()
    empirical: bool = False
    geometric: bool = False
    draft_share: float = 1.0

    def __post_init__(self) -> None:
        if not self.rates:
            raise ValueError("an acceptance model needs at least one rate")
        for i, a in enumerate(self.rates, 1):
            if not (isinstance(a, int | float) and 0.0 <= a <= 1.0):
                raise ValueError(f"acceptance rate a_{i} must be in [0, 1], got {a!r}")
        share = self.draft_share
        if not (isinstance(share, int | float) and 0.0 <= share <= 1.0):
            raise ValueError(f"draft share must be in [0, 1], got {share!r}")
        if self.empirical and not self.histogram:
            raise ValueError("empirical draws need a histogram of accepted lengths")

    @staticmethod
    def of_rates(rates: Sequence[float], source: str = "given rates") -> AcceptanceModel:
        """The model of per-position rates ``a_1 .. a_K``."""
        return AcceptanceModel(tuple(float(a) for a in rates), source)

    @staticmethod
    def of_rate(rate: float, source: str = "given rate") -> AcceptanceModel:
        """One rate for every position (the accepted count is a truncated geometric)."""
        return AcceptanceModel((float(rate),), source, geometric=True)

    @staticmethod
    def of_histogram(
        counts: Sequence[int],
        source: str = "histogram",
        empirical: bool = False,
        tested: Sequence[int] = (),
    ) -> AcceptanceModel:
        """Rates estimated from ``counts[n]``, the verify slots that accepted ``n`` draft tokens
        (``n`` = 0 .. K): with ``tested[i - 1]``, the slots whose draft token ``i`` was tested
        (the engine's per-position counter), ``a_i = P(n >= i) / tested[i - 1]``; without,
        ``a_i = P(n >= i) / P(n >= i - 1)``, which takes every slot that accepted ``i - 1`` to
        have tested token ``i`` and so reads a draft shorter than ``K``, accepted whole, as a
        rejection (low). 0 where no slot got that far."""
        hist, tried = tuple(counts), tuple(tested)
        if len(hist) < 2:
            raise ValueError(
                f"{source}: a histogram of accepted lengths needs counts for 0 .. K >= 1"
            )
        for what, values in (("accepted length", hist), ("tested position", tried)):
            for n, c in enumerate(values):
                if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                    raise ValueError(f"{source}: count of {what} {n} must be an integer >= 0")
        if sum(hist) == 0:
            raise ValueError(f"{source}: the histogram counts no verify slot")
        at_least = np.cumsum(hist[::-1])[::-1]  # at_least[i] = slots with n >= i
        if tried:
            tried += (0,) * (len(hist) - 1 - len(tried))
            if len(tried) != len(hist) - 1 or any(
                at_least[i + 1] > t or t > at_least[i] for i, t in enumerate(tried)
            ):
                raise ValueError(
                    f"{source}: tested counts {list(tried)} do not fit the accepted lengths "
                    f"{list(hist)} (each position tested at least as often as passed, at most "
                    "as often as the one before was accepted)"
                )
        tries = tried if tried else at_least[:-1]
        rates = tuple(
            float(at_least[i] / tries[i - 1]) if tries[i - 1] else 0.0 for i in range(1, len(hist))
        )
        return AcceptanceModel(rates, source, hist, tried, empirical)

    @property
    def max_drafts(self) -> int | None:
        """The most draft tokens per slot the model covers (None: any, geometric)."""
        return None if self.geometric else len(self.rates)

    def check_covers(self, num_draft_tokens: int) -> None:
        """``ValueError`` unless slots of ``num_draft_tokens`` drafts can be drawn."""
        most = self.max_drafts
        if most is not None and num_draft_tokens > most:
            raise ValueError(
                f"the acceptance model ({self.source}) covers {most} draft positions, "
                f"--num-draft-tokens {num_draft_tokens} needs as many (one rate repeats for any)"
            )

    def rate(self, i: int) -> float:
        """``a_i``, for draft position ``i`` >= 1."""
        return self.rates[0] if self.geometric else self.rates[i - 1]

    def pmf(self, k: int) -> np.ndarray:
        """The histogram's distribution of the accepted count of a slot with ``k`` drafts."""
        hist = np.asarray(self.histogram[: k + 1], dtype=np.float64)
        hist[-1] += sum(self.histogram[k + 1 :])
        pmf: np.ndarray = hist / hist.sum()
        return pmf

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "draw": "empirical" if self.empirical else "rates",
            "rates": list(self.rates),
            "geometric": self.geometric,
            "draft_share": self.draft_share,
            "source": self.source,
        }
        if self.histogram:
            out["histogram"] = list(self.histogram)
        if self.tested:
            out["tested_per_position"] = list(self.tested)
        return out


@dataclass(slots=True)
class AcceptanceDraws:
    """Draws accepted counts for the draft slots of plans, and tallies them as the engine's
    ``/metrics`` does (``accepted_lengths[n]``: slots that accepted ``n``;
    ``tested_per_position[i]``: slots whose draft token ``i``, from 0, was tested)."""

    model: AcceptanceModel
    seed: int = 0
    verify_slots: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    tested_per_position: list[int] = field(default_factory=list)
    _cdfs: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def draw(self, plan: Plan) -> dict[str, int] | None:
        """The accepted draft tokens of each of ``plan``'s slots with a draft (None: none)."""
        slots = [d for d in plan.decode if d.draft]
        if not slots:
            return None
        ks = np.fromiter((len(d.draft) for d in slots), np.int64, len(slots))
        keys = np.fromiter((zlib.crc32(d.rid.encode()) for d in slots), np.uint64, len(slots))
        positions = np.fromiter((d.position for d in slots), np.uint64, len(slots))
        if self.model.empirical:
            u = uniforms(self.seed, keys, positions)
            counts = [
                int(np.searchsorted(self._cdf(int(k)), x, side="right"))
                for k, x in zip(ks, u, strict=True)
            ]
        else:
            counts = self._chain(ks, keys, positions)
        for n, k in zip(counts, ks, strict=True):
            tally(self.accepted_lengths, n)
            for i in range(min(n + 1, int(k))):
                tally(self.tested_per_position, i)
        self.verify_slots += len(slots)
        self.draft_tokens += int(ks.sum())
        self.accepted_tokens += sum(counts)
        return {d.rid: n for d, n in zip(slots, counts, strict=True)}

    def _chain(self, ks: np.ndarray, keys: np.ndarray, positions: np.ndarray) -> list[int]:
        """Per slot, the draft positions accepted before the first rejection: position ``i``
        of a slot at ``p`` is accepted when its uniform (at ``p + i``) is below ``a_i``."""
        most = int(ks.max())
        offsets = np.arange(1, most + 1, dtype=np.uint64)
        u = uniforms(self.seed, keys[:, None], positions[:, None] + offsets[None, :])
        rates = np.array([self.model.rate(i) for i in range(1, most + 1)])
        ok = (u < rates[None, :]) & (np.arange(most)[None, :] < ks[:, None])
        accepted: np.ndarray = np.cumprod(ok, axis=1).sum(axis=1)
        return [int(n) for n in accepted]

    def _cdf(self, k: int) -> np.ndarray:
        cdf = self._cdfs.get(k)
        if cdf is None:
            cdf = self._cdfs[k] = np.cumsum(self.model.pmf(k))[:-1]
        return cdf

    def describe(self) -> dict[str, Any]:
        """The model and what the run drew (the counters of the engine's ``/metrics``)."""
        rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else math.nan
        return {
            "acceptance": self.model.describe(),
            "seed": self.seed,
            "verify_slots": self.verify_slots,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": rate,
            "accepted_lengths": list(self.accepted_lengths),
            "tested_per_position": list(self.tested_per_position),
        }

    def add(self, other: AcceptanceDraws) -> None:
        """Add ``other``'s tallies (another replica's) to these."""
        self.verify_slots += other.verify_slots
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens
        for counts, more in (
            (self.accepted_lengths, other.accepted_lengths),
            (self.tested_per_position, other.tested_per_position),
        ):
            for i, count in enumerate(more):
                tally(counts, i, count)


def tally(counts: list[int], index: int, by: int = 1) -> None:
    """``counts[index] += by``, growing ``counts`` with zeros as needed."""
    if index >= len(counts):
        counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += by


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on ``uint64`` (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: np.ndarray = x ^ (x >> np.uint64(31))
        return out


def uniforms(seed: int, keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1), one per (request key, position), a hash of them and ``seed``."""
    salt = _mix(np.array([seed & 0xFFFF_FFFF_FFFF_FFFF], dtype=np.uint64))
    base = _mix(np.asarray(keys, dtype=np.uint64) ^ salt)
    bits = _mix(base + np.asarray(positions, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03))
    out: np.ndarray = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return out
