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
row weighted by 1 / t), so short steps count as much as long ones, with every
extra feature's coefficient ``d_j >= 0``: reading more context or attending over
more query-key pairs never makes a step cheaper. A grid whose rows do not tell a
feature apart from the spine (pure prefills of one sequence each: their
query-key pairs follow from their tokens) otherwise lets a negative ``d_j``
trade against steeper spine slopes, and a step off the grid (several prompts,
fewer pairs than one prompt of as many tokens) pays for both. With a knot
at every measured ``x`` the spine follows step shapes such as CUDA-graph
batch-size buckets as finely as the grid resolves them: measuring both sides
of a step (e.g. batch 16 and 17) pins it.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
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
        design = shell.design(x, extras) / y[:, None]
        coef = nonnegative_tail_lstsq(design, extras.shape[1])
        return PiecewiseFit(knots, tuple(float(c) for c in coef), extras.shape[1])

    def spine(self, x: np.ndarray) -> np.ndarray:
        """The spine's columns of the design (``[rows, 1 + len(knots) - 1]``) for rows ``x``."""
        x0 = self.knots[0]
        xp = np.maximum(np.asarray(x, dtype=np.float64), x0)
        interior = np.asarray(self.knots[1:-1], dtype=np.float64)
        out = np.empty((len(xp), len(self.knots) if len(self.knots) >= 2 else 1))
        out[:, 0] = 1.0
        if len(self.knots) >= 2:
            out[:, 1] = xp - x0
            np.maximum(xp[:, None] - interior[None, :], 0.0, out=out[:, 2:])
        return out

    def design(self, x: np.ndarray, extras: np.ndarray) -> np.ndarray:
        """The regression's columns for rows ``x`` (spine) and ``extras``, one C-ordered matrix."""
        spine = self.spine(x)
        extras = np.asarray(extras, dtype=np.float64)
        out = np.empty((len(spine), spine.shape[1] + extras.shape[1]))
        out[:, : spine.shape[1]] = spine
        out[:, spine.shape[1] :] = extras
        return out

    def predict(self, x: np.ndarray, extras: np.ndarray) -> np.ndarray:
        pred: np.ndarray = self.design(x, extras) @ np.asarray(self.coef)
        return pred

    def predict_one(self, x: float, extras: tuple[float, ...]) -> float:
        """``predict`` for one row, in plain Python (the simulator calls it once a step)."""
        return self.add_extras(self.spine_one(x), extras)

    def spine_one(self, x: float) -> float:
        """The spine's terms of ``predict_one`` for ``x``, summed in its order."""
        coef, knots = self.coef, self.knots
        xp = max(x, knots[0])
        t = coef[0]
        if len(knots) >= 2:
            t += coef[1] * (xp - knots[0])
            for j in range(1, bisect_left(knots, xp, 1, len(knots) - 1)):  # knots below xp
                t += coef[j + 1] * (xp - knots[j])
        return t

    def add_extras(self, t: float, extras: tuple[float, ...]) -> float:
        """``t`` (``spine_one``'s sum) plus the extra features' terms, added in order."""
        for f, d in zip(extras, self.coef[len(self.coef) - self.num_extras :], strict=True):
            t += d * f
        return t


def nonnegative_tail_lstsq(design: np.ndarray, bounded: int) -> np.ndarray:
    """Least squares of ``design @ c = 1`` with the last ``bounded`` coefficients ``>= 0``.

    Exact by enumeration: the optimum leaves some of the bounded coefficients at zero and
    solves the rest freely, so the best feasible solution over every choice of free ones is
    it (``bounded`` is at most a few features: ``2 ** bounded`` small solves).
    """
    target = np.ones(len(design))
    free = design.shape[1] - bounded
    best, best_cost = np.zeros(design.shape[1]), math.inf
    for kept in itertools.product((True, False), repeat=bounded):  # all free first
        cols = np.concatenate([np.ones(free, dtype=bool), np.array(kept, dtype=bool)])
        sub, *_ = np.linalg.lstsq(design[:, cols], target, rcond=None)
        if np.any(sub[free:] < 0):
            continue
        coef = np.zeros(design.shape[1])
        coef[cols] = sub
        if all(kept):  # the unbounded optimum is feasible: it is the optimum
            return coef
        cost = float(np.sum((design @ coef - target) ** 2))
        if cost < best_cost:  # every bounded coefficient at zero is feasible: one is
            best, best_cost = coef, cost
    return best


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
