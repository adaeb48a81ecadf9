"""Weighted samples give the statistics of the expanded array, bit for bit."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

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
