"""A multiset of floats held as values with integer counts.

A fast-forwarded decode run of ``b`` requests gives each of them the same
inter-token gaps, so the pooled ITL of an hour-long replay (millions of gaps)
is held as its distinct gaps and how often each occurs. Statistics equal those
of the expanded array ``np.repeat(values, counts)``: percentiles follow
``np.percentile``'s default (linear) method step by step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Samples(Protocol):
    """What a run's summary asks of its samples (``WeightedSamples`` in memory,
    ``schema.spill.SpilledSamples`` on disk)."""

    @property
    def size(self) -> int: ...
    def finite(self) -> Samples: ...
    def scaled(self, factor: float) -> Samples: ...
    def mean(self) -> float: ...
    def percentile(self, q: list[float] | tuple[float, ...] | np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class WeightedSamples:
    """``values[i]`` occurs ``counts[i]`` times (counts >= 1)."""

    values: np.ndarray
    counts: np.ndarray

    @staticmethod
    def of(values: np.ndarray | list[float]) -> WeightedSamples:
        """Each value once."""
        v = np.asarray(values, dtype=np.float64)
        return WeightedSamples(v, np.ones(len(v), dtype=np.int64))

    @property
    def size(self) -> int:
        """Number of samples, counting repeats."""
        return int(self.counts.sum())

    def scaled(self, factor: float) -> WeightedSamples:
        return WeightedSamples(self.values * factor, self.counts)

    def finite(self) -> WeightedSamples:
        """The finite samples; ``self`` when all are."""
        keep = np.isfinite(self.values)
        if keep.all():
            return self
        return WeightedSamples(self.values[keep], self.counts[keep])

    def sorted(self) -> WeightedSamples:
        """By value; ``self`` when it already is."""
        if (self.values[1:] >= self.values[:-1]).all():
            return self
        order = np.argsort(self.values, kind="stable")
        values = self.values[order]
        return WeightedSamples(values, self.counts[order])

    def mean(self) -> float:
        if self.counts.max(initial=0) == 1:
            return float(self.values.mean())  # pairwise summation, as np.mean of the samples
        return float(np.dot(self.values, self.counts) / self.size)

    def at_ranks(self, ranks: np.ndarray) -> np.ndarray:
        """The values at 0-based ``ranks`` of the expanded, sorted samples (``self`` sorted)."""
        if self.counts.max(initial=0) > 1:
            ranks = np.searchsorted(np.cumsum(self.counts), ranks, side="right")
        picked: np.ndarray = self.values[ranks]
        return picked

    def percentile(self, q: list[float] | tuple[float, ...] | np.ndarray) -> np.ndarray:
        """``np.percentile(np.repeat(values, counts), q)`` of finite samples, without the copy."""
        s = self.finite().sorted()
        return interpolate(s.size, q, s.at_ranks)

    def cdf_points(self, max_points: int) -> tuple[np.ndarray, np.ndarray]:
        """At most ``max_points`` (value, cumulative fraction) points of the empirical CDF
        of the finite samples; the smallest and the largest value are always kept."""
        s = self.finite().sorted()
        n = s.size
        if n == 0:
            return np.zeros(0), np.zeros(0)
        ranks = np.unique(np.linspace(0, n - 1, min(n, max_points)).round().astype(np.int64))
        return s.at_ranks(ranks), (ranks + 1) / n


def interpolate(
    n: int,
    q: list[float] | tuple[float, ...] | np.ndarray,
    at_ranks: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """Percentiles ``q`` of ``n`` sorted samples read through ``at_ranks`` (0-based ranks),
    step by step as ``np.percentile``'s default (linear) method."""
    if n == 0:
        raise ValueError("percentile of no samples")
    virtual = (n - 1) * np.true_divide(np.asarray(q, dtype=np.float64), 100)
    previous = np.floor(virtual)
    following = previous + 1
    above = virtual >= n - 1
    previous[above] = n - 1
    following[above] = n - 1
    ab = at_ranks(np.concatenate([previous, following]).astype(np.int64))
    a, b = ab[: len(previous)], ab[len(previous) :]
    gamma = virtual - previous
    diff = b - a
    out: np.ndarray = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
    return out
