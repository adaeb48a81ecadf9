"""The exact sum of many floats, added chunk by chunk and rounded once when read.

A float sum in numpy depends on the order of its terms and on how they are
chunked; a table written as the run goes sees its columns in chunks, so its
sums and means are taken exactly instead: each float64 is an integer mantissa
times a power of two, the mantissas are added as integers per exponent, and the
total is rounded to the nearest float once. The result is the correctly
rounded sum (or mean) of the terms, whatever their order and chunks.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

_EXPONENTS = 2048  # float64's biased exponent field
_FRACTION_BITS = 52
_SPLIT = 26  # mantissa = hi * 2^26 + lo, halves below 2^27
_CHUNK = 1 << 25
"""Terms added at once: float64 sums of 2^25 halves (< 2^52) are exact integers."""


class ExactSum:
    """Sum and count of every finite float added (non-finite ones are an error)."""

    def __init__(self) -> None:
        self._hi = np.zeros(_EXPONENTS, dtype=np.int64)
        self._lo = np.zeros(_EXPONENTS, dtype=np.int64)
        self.count = 0

    def add(self, values: np.ndarray) -> None:
        v = np.ascontiguousarray(values, dtype=np.float64)
        if not np.isfinite(v).all():
            raise ValueError("ExactSum adds finite values only")
        for start in range(0, len(v), _CHUNK):
            self._add(v[start : start + _CHUNK])
        self.count += len(v)

    def _add(self, v: np.ndarray) -> None:
        bits = v.view(np.int64)
        slot = (bits >> _FRACTION_BITS) & (_EXPONENTS - 1)
        m = bits & ((1 << _FRACTION_BITS) - 1)
        m |= (slot > 0).astype(np.int64) << _FRACTION_BITS  # the implicit leading bit
        np.negative(m, out=m, where=bits < 0)
        hi = m >> _SPLIT
        lo = m - (hi << _SPLIT)
        self._hi += np.bincount(slot, weights=hi, minlength=_EXPONENTS).astype(np.int64)
        self._lo += np.bincount(slot, weights=lo, minlength=_EXPONENTS).astype(np.int64)

    def _total(self) -> Fraction:
        """The exact sum: slot e (e >= 1) counts units of 2^(e - 1075), slot 0 as slot 1."""
        numerator = 0
        for slot in np.flatnonzero(self._hi | self._lo):
            part = (int(self._hi[slot]) << _SPLIT) + int(self._lo[slot])
            numerator += part << max(int(slot) - 1, 0)
        return Fraction(numerator, 1 << 1074)

    def sum(self) -> float:
        return float(self._total())

    def mean(self) -> float:
        """The correctly rounded mean; NaN of no values."""
        if self.count == 0:
            return float("nan")
        return float(self._total() / self.count)
