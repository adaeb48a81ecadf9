"""Fixed-width time bins that turn 10^6-row series into at most a few thousand points.

Every function takes the same ``TimeBins`` so that all timelines of a report
share one x axis. Values that fall outside ``[start, end]`` or are NaN are
dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_POINTS = 2000
"""Upper bound on the points of one timeline trace."""


@dataclass(frozen=True, slots=True)
class TimeBins:
    start: float
    end: float
    count: int

    @staticmethod
    def covering(times: list[np.ndarray], max_points: int = MAX_POINTS) -> TimeBins:
        """Bins spanning every finite value in ``times`` (``[0, 1]`` when there is none)."""
        finite = [t[np.isfinite(t)] for t in times if t.size]
        finite = [t for t in finite if t.size]
        if not finite:
            return TimeBins(0.0, 1.0, 1)
        lo = min(float(t.min()) for t in finite)
        hi = max(float(t.max()) for t in finite)
        if hi <= lo:
            hi = lo + 1.0
        return TimeBins(lo, hi, max(1, max_points))

    @property
    def width(self) -> float:
        return (self.end - self.start) / self.count

    def centers(self) -> np.ndarray:
        return self.start + (np.arange(self.count) + 0.5) * self.width

    def edges(self) -> np.ndarray:
        return self.start + np.arange(self.count + 1) * self.width

    def index(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bin index of each kept value, and the mask of kept values."""
        keep = np.isfinite(times) & (times >= self.start) & (times <= self.end)
        offset = np.subtract(times if keep.all() else times[keep], self.start)
        offset /= self.width
        idx = offset.astype(np.int64)
        del offset
        return np.minimum(idx, self.count - 1, out=idx), keep


def bin_count(bins: TimeBins, times: np.ndarray) -> np.ndarray:
    """Number of events per bin."""
    idx, _ = bins.index(times)
    return np.bincount(idx, minlength=bins.count).astype(float)


def _binned_values(
    bins: TimeBins, times: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Bin index and value (as float) of each kept, finite value; no copy where all are kept."""
    idx, keep = bins.index(times)
    v = (values if keep.all() else values[keep]).astype(float)
    ok = np.isfinite(v)
    if ok.all():
        return idx, v
    return idx[ok], v[ok]


def sorted_samples(times: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The finite (time, value) samples in time order (stable); no sort where already sorted."""
    ok = np.isfinite(times) & np.isfinite(values)
    t, v = (times, values.astype(float)) if ok.all() else (times[ok], values[ok].astype(float))
    if t.size and not (t[1:] >= t[:-1]).all():
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
    return t, v


def bin_sum(bins: TimeBins, times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sum of ``values`` per bin (0 for empty bins)."""
    idx, v = _binned_values(bins, times, values)
    return np.bincount(idx, weights=v, minlength=bins.count)


def bin_mean(bins: TimeBins, times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Mean of ``values`` per bin (NaN for empty bins)."""
    idx, v = _binned_values(bins, times, values)
    total = np.bincount(idx, weights=v, minlength=bins.count)
    n = np.bincount(idx, minlength=bins.count)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def bin_max(bins: TimeBins, times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Maximum of ``values`` per bin (NaN for empty bins)."""
    idx, v = _binned_values(bins, times, values)
    out = np.full(bins.count, np.nan)
    if not idx.size:
        return out
    order = np.argsort(idx, kind="stable") if np.any(np.diff(idx) < 0) else None
    if order is not None:
        idx, v = idx[order], v[order]
    starts = np.flatnonzero(np.r_[True, np.diff(idx) > 0])
    out[idx[starts]] = np.maximum.reduceat(v, starts)
    return out


def step_function_max(bins: TimeBins, times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per-bin maximum of a series sampled on change (the value holds until the next sample).

    A bin without samples takes the value carried in from the last earlier sample.
    """
    t, v = sorted_samples(times, values)
    out = bin_max(bins, t, v)
    carried_at = np.searchsorted(t, bins.edges()[:-1], side="right") - 1
    carried = np.where(carried_at >= 0, v[np.maximum(carried_at, 0)] if v.size else 0.0, np.nan)
    peak: np.ndarray = np.fmax(out, carried)
    return peak


def last_value_at_edges(bins: TimeBins, times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Value of a cumulative counter at each bin edge (0 before its first sample)."""
    t, v = sorted_samples(times, values)
    at = np.searchsorted(t, bins.edges(), side="right") - 1
    if not v.size:
        return np.zeros(bins.count + 1)
    at_edges: np.ndarray = np.where(at >= 0, v[np.maximum(at, 0)], 0.0)
    return at_edges


def step_function_mean(bins: TimeBins, times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per-bin time-weighted mean of a series sampled on change (0 before its first sample).

    Samples at the same instant count only by the last one, as their value held
    for no time.
    """
    t, v = sorted_samples(times, values)
    if not t.size:
        return np.zeros(bins.count)
    area_at_sample = np.concatenate([[0.0], np.cumsum(v[:-1] * np.diff(t))])
    edges = bins.edges()
    k = np.searchsorted(t, edges, side="right") - 1
    before = k < 0
    kc = np.maximum(k, 0)
    area = np.where(before, 0.0, area_at_sample[kc] + v[kc] * (edges - t[kc]))
    mean: np.ndarray = np.diff(area) / bins.width
    return mean
