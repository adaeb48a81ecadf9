"""The load regime of a run: stable, backlogged or overloaded, from its queues over time.

Over the run's arrival window ``[first arrival, last arrival]`` of its completed
requests (``requests.csv`` times), two counts::

    in_system(t) = requests arrived by t - requests finished by t
    waiting(t)   = requests tokenized by t - requests first scheduled by t
                   (the scheduler's waiting queue; arrived - first token by t
                   when the server reports no stage times)

    growth       = slope of in_system(t) over the window's last three quarters
                   (least squares on GRID_POINTS even samples) / arrival rate
    gain         = that slope * the length of those three quarters (the requests
                   the system gained over them)
    mean_waiting = the time average of waiting(t) over the window

A stable engine holds a steady number of requests, so ``growth`` is near 0; one
that completes only a rate mu of the offered rate lambda gains lambda - mu
requests a second, so ``growth`` = 1 - mu / lambda. The window's first quarter
is left out, where the count fills from zero to its steady level.
``mean_waiting`` is, by Little's law, the arrival rate times the mean wait for
admission: 1 or more means a request waits at least one mean inter-arrival time.

    overloaded   growth >= OVERLOAD_GROWTH (0.10: the engine completes at most
                 about 90 % of the offered rate, and the queue grows all run)
                 and gain >= OVERLOAD_GAIN (3 requests: on a few dozen requests,
                 later and longer ones, or a burst at the window's end, tilt the
                 slope past 0.10 without the engine falling behind)
    backlogged   not overloaded, mean_waiting >= BACKLOG_WAITING (1 request)
    stable       neither
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

REGIMES = ("stable", "backlogged", "overloaded")
OVERLOAD_GROWTH = 0.10
OVERLOAD_GAIN = 3.0
BACKLOG_WAITING = 1.0
GRID_POINTS = 200
SKIP_FILL = 0.25


def _times(done: pd.DataFrame, column: str) -> np.ndarray:
    if column not in done:
        return np.full(len(done), np.nan)
    times: np.ndarray = done[column].to_numpy(np.float64)
    return times


def _mean_count(start: np.ndarray, end: np.ndarray, t0: float, t1: float) -> float:
    """Time average over [t0, t1] of the number of intervals [start, end) that hold t."""
    overlap = np.clip(np.minimum(end, t1) - np.maximum(start, t0), 0.0, None)
    return float(overlap.sum() / (t1 - t0))


def classify(requests: pd.DataFrame) -> dict[str, Any]:
    """The regime of one run, with the figures it was decided on (see the module docstring);
    ``regime`` None when fewer than two completed requests span a window."""
    done = requests[requests["status"] == "completed"]
    arrival, finished = _times(done, "arrival"), _times(done, "finished")
    t0, t1 = (float(arrival.min()), float(arrival.max())) if len(done) else (0.0, 0.0)
    out: dict[str, Any] = {"regime": None, "growth": None, "gain": None, "mean_waiting": None,
                           "arrival_rate": None, "window_s": t1 - t0}  # fmt: skip
    if len(done) < 2 or not t1 > t0:
        return out
    rate = (len(done) - 1) / (t1 - t0)
    grid = np.linspace(t0 + SKIP_FILL * (t1 - t0), t1, GRID_POINTS)
    in_system = np.searchsorted(np.sort(arrival), grid, side="right") - np.searchsorted(
        np.sort(finished), grid, side="right"
    )
    slope = float(np.polyfit(grid, in_system, 1)[0])
    growth, gain = slope / rate, slope * (t1 - float(grid[0]))
    start, end = _times(done, "tokenized"), _times(done, "first_scheduled")
    if not (np.isfinite(start).all() and np.isfinite(end).all()):
        start, end = arrival, _times(done, "first_token")
    waiting = _mean_count(start, end, t0, t1)
    if growth >= OVERLOAD_GROWTH and gain >= OVERLOAD_GAIN:
        regime = "overloaded"
    else:
        regime = "backlogged" if waiting >= BACKLOG_WAITING else "stable"
    out.update(regime=regime, growth=growth, gain=gain, mean_waiting=waiting, arrival_rate=rate)
    return out


def regimes(real: list[pd.DataFrame], sim: pd.DataFrame) -> dict[str, Any]:
    """``comparison.json``'s ``regime``: each real run's, the real side's (the most loaded of
    its runs), the simulation's, and the thresholds they were decided by."""
    runs = [classify(r) for r in real]
    known = [r["regime"] for r in runs if r["regime"] is not None]
    return {
        "real": max(known, key=REGIMES.index) if known else None,
        "real_runs": runs,
        "sim": classify(sim),
        "thresholds": {
            "overload_growth": OVERLOAD_GROWTH,
            "overload_gain": OVERLOAD_GAIN,
            "backlog_waiting": BACKLOG_WAITING,
        },
    }


def describe(regime: dict[str, Any]) -> str:
    """One line: the real regime, each run's growth and mean waiting, the simulation's."""

    def one(r: dict[str, Any]) -> str:
        if r["regime"] is None:
            return "-"
        growth, gain, waiting = r["growth"], r["gain"], r["mean_waiting"]
        return f"{r['regime']} (growth {growth:+.3f}, gain {gain:+.1f}, waiting {waiting:.2f})"

    runs = "; ".join(one(r) for r in regime["real_runs"])
    return f"real run: {regime['real'] or '-'} [{runs}]; simulated: {one(regime['sim'])}"
