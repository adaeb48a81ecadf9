"""Weighted samples give the statistics of the expanded array, bit for bit, in memory or on
disk; exact sums are the correctly rounded sums."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schema import spill
from schema.exactsum import ExactSum
from schema.samples import WeightedSamples


@settings(max_examples=80, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.floats(-1e3, 1e3, allow_nan=False), st.integers(1, 20)),
        min_size=1,
        max_size=40,
    ),
    q=st.lists(st.floats(0, 100), min_size=1, max_size=5),
)
def test_percentile_and_cdf_equal_the_expanded_array(
    pairs: list[tuple[float, int]], q: list[float]
) -> None:
    values = np.array([v for v, _ in pairs])
    counts = np.array([c for _, c in pairs])
    s = WeightedSamples(values, counts)
    expanded = np.repeat(values, counts)
    np.testing.assert_array_equal(s.percentile(q), np.percentile(expanded, q))
    assert s.size == len(expanded)
    assert s.mean() == np.float64(np.dot(values, counts) / len(expanded))
    x, y = s.cdf_points(7)
    ranks = np.unique(np.linspace(0, len(expanded) - 1, min(len(expanded), 7)).round())
    np.testing.assert_array_equal(x, np.sort(expanded)[ranks.astype(int)])
    np.testing.assert_array_equal(y, (ranks + 1) / len(expanded))


def test_plain_samples_keep_numpy_statistics_and_drop_nan() -> None:
    values = np.array([3.0, np.nan, 1.0, 2.5, 10.0])
    s = WeightedSamples.of(values).finite()
    assert s.mean() == np.nanmean(values)
    np.testing.assert_array_equal(s.percentile([50, 99]), np.nanpercentile(values, [50, 99]))


@settings(max_examples=60, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(
            st.one_of(st.floats(-1e3, 1e3, allow_nan=False), st.just(np.nan), st.just(2.5)),
            st.integers(1, 20),
        ),
        min_size=1,
        max_size=60,
    ),
    q=st.lists(st.floats(0, 100), min_size=1, max_size=5),
    chunks=st.integers(1, 4),
    collect=st.sampled_from([1, 3, 1 << 22]),
)
def test_spilled_samples_give_the_percentiles_of_the_samples_in_memory(
    pairs: list[tuple[float, int]], q: list[float], chunks: int, collect: int
) -> None:
    """Radix selection over the file (small buckets force every pass) finds the very values;
    the mean is the exact one, within 1e-12 of numpy's float sum."""
    values = np.array([v for v, _ in pairs])
    counts = np.array([c for _, c in pairs])
    memory = WeightedSamples(values, counts).finite()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spill, "COLLECT_PAIRS", collect)
        mp.setattr(spill, "READ_PAIRS", 7)
        disk = spill.SpilledSamples()
        for v, c in zip(
            np.array_split(values, chunks), np.array_split(counts, chunks), strict=True
        ):
            disk.add(v, c)
        assert disk.size == memory.size
        if memory.size == 0:
            return
        scaled = disk.scaled(1e3)
        np.testing.assert_array_equal(scaled.percentile(q), memory.scaled(1e3).percentile(q))
        assert disk.mean() == pytest.approx(memory.mean(), rel=1e-12, abs=1e-300)
        loaded = disk.load()
        np.testing.assert_array_equal(
            np.repeat(loaded.values, loaded.counts),
            np.sort(np.repeat(memory.values, memory.counts)),
        )


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-1e300, 1e300), max_size=80),
    chunks=st.integers(1, 5),
)
def test_exact_sum_is_the_correctly_rounded_sum_whatever_the_chunks(
    values: list[float], chunks: int
) -> None:
    total = ExactSum()
    for part in np.array_split(np.array(values, dtype=np.float64), chunks):
        total.add(part)
    assert total.count == len(values)
    assert total.sum() == math.fsum(values)
    if values:
        assert total.mean() == float(sum(map(Fraction, values)) / len(values))


def test_exact_sum_refuses_what_is_not_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        ExactSum().add(np.array([1.0, np.inf]))
