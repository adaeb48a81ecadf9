"""Piecewise-linear least squares: the step-time fit behind the ``table`` cost model.

A ``PiecewiseFit`` predicts a time from one *spine* variable ``x`` (a step's
decode batch size, or its token count) through a continuous piecewise-linear
function with a knot at every distinct measured ``x``, plus linear terms in
extra features (context read, attention pairs)::

    x' = max(x, x_0)
    t  = a + b (x' - x_0) + sum_i c_i max(x' - x_i, 0) + sum_j d_j f_j      (i: interior knots)

Below the smallest measured ``x`` the spine is flat (no step is cheaper than
the smallest one measured); above the largest it continues the last
segment's slope. The coefficients minimise the squared *relative* error (each
row weighted by 1 / t), so short steps count as much as long ones. With a knot
at every measured ``x`` the spine follows step shapes such as CUDA-graph
batch-size buckets as finely as the grid resolves them: measuring both sides
of a step (e.g. batch 16 and 17) pins it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class PiecewiseFit:
    knots: tuple[float, ...]  # sorted distinct spine values of the rows that define the spine
    coef: tuple[float, ...]  # a, then b (two knots or more), then c_i, then d_j
    num_extras: int

    @staticmethod
    def fit(
        x: np.ndarray, extras: np.ndarray, y: np.ndarray, spine_rows: np.ndarray | None = None
    ) -> PiecewiseFit:
        """Fit to rows ``(x, extras[i], y)``; knots at the distinct ``x`` of ``spine_rows``.

        ``extras`` is ``[rows, features]``; ``spine_rows`` (a boolean mask, default
        all) picks the rows whose ``x`` become knots.
        """
        if len(y) == 0:
            raise ValueError("no rows to fit")
        if not np.all(y > 0):
            raise ValueError("measured times must be > 0")
        mask = np.ones(len(x), dtype=bool) if spine_rows is None else spine_rows
        if not mask.any():
            mask = np.ones(len(x), dtype=bool)
        knots = tuple(float(k) for k in np.unique(x[mask]))
        shell = PiecewiseFit(knots, (), extras.shape[1])
        design = shell.design(x, extras)
        coef, *_ = np.linalg.lstsq(design / y[:, None], np.ones(len(y)), rcond=None)
        return PiecewiseFit(knots, tuple(float(c) for c in coef), extras.shape[1])

    def design(self, x: np.ndarray, extras: np.ndarray) -> np.ndarray:
        """The regression's columns for rows ``x`` (spine) and ``extras``."""
        x0 = self.knots[0]
        xp = np.maximum(np.asarray(x, dtype=np.float64), x0)
        columns = [np.ones(len(xp))]
        if len(self.knots) >= 2:
            columns.append(xp - x0)
        columns += [np.maximum(xp - k, 0.0) for k in self.knots[1:-1]]
        return np.column_stack([*columns, np.asarray(extras, dtype=np.float64)])

    def predict(self, x: np.ndarray, extras: np.ndarray) -> np.ndarray:
        pred: np.ndarray = self.design(x, extras) @ np.asarray(self.coef)
        return pred

    def predict_one(self, x: float, extras: tuple[float, ...]) -> float:
        """``predict`` for one row, in plain Python (the simulator calls it once a step)."""
        coef, knots = self.coef, self.knots
        xp = max(x, knots[0])
        t = coef[0]
        if len(knots) >= 2:
            t += coef[1] * (xp - knots[0])
            for k, c in zip(knots[1:-1], coef[2 : len(knots)], strict=True):
                if xp > k:
                    t += c * (xp - k)
        for f, d in zip(extras, coef[len(coef) - self.num_extras :], strict=True):
            t += d * f
        return t


def relative_errors(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float | int]:
    """``rows`` and the mean, P90 and max of |predicted / measured - 1| (NaN without rows)."""
    if len(measured) == 0:
        return {"rows": 0, "mean": float("nan"), "p90": float("nan"), "max": float("nan")}
    err = np.abs(predicted / measured - 1.0)
    return {
        "rows": len(measured),
        "mean": float(err.mean()),
        "p90": float(np.percentile(err, 90)),
        "max": float(err.max()),
    }
