"""Recorded steps as a cost model: a run's own step times for the steps it ran.

``RecordedCostModel(record, wrapped, overlap)`` prices the steps of a replay
from a step record (``engine_steps.csv``, ``schema.steprecord``) of a run of
the same trace:

- **Match.** A step whose ``StepShape`` equals a recorded step's gets that
  step's times. Matches are consumed in step order: the n-th step of a shape
  priced gets the n-th recorded step of that shape, and each recorded step
  prices one step at most. Each ``step_time`` or ``times`` call prices one step
  (the loops ask once a step), so a replay with recorded steps steps one by one
  (``fast_forward`` off): a fast-forwarded run priced ahead and cut short would
  consume steps it never ran.
- **A recorded step's times** (``recorded_times``): ``device`` = ``device_ms``,
  or ``done - launched`` where the record has no device time; the strict
  loop's ``step_time`` = ``done - schedule_end`` (the loop adds the
  scheduler's modelled CPU time in front, as for any model); the overlapped
  loop's ``step_time`` = ``host + device``, so that the loop's host work
  (``step_time - device_time``) is ``host`` and its GPU period the recorded
  device time. ``host`` is the time from the end of ``schedule`` until the
  host began handing the step to the device (``enqueued``), where the device
  time starts. Records written before ``enqueued`` existed read it as until
  ``launched``, or until ``done - device`` when that is earlier; that reading
  runs long for eager steps: an eager forward (a step with prefill) is
  launched kernel by kernel while the device already runs the first ones, so
  its ``launched`` comes after most of its device work (on the H200, 18 ms of
  launch against 3 ms from ``launched`` to ``done``), and with overlap its
  ``done`` comes after the next step's launch (for an eager next step, 15-40
  ms later).
- **No match.** Any other step gets the wrapped model's times scaled by what
  the record says of the model on similar steps: the median over recorded
  steps of the same kind (``step_kind``: pure decode, mixed, prefill only) and
  the same band of step tokens (``band`` of prefill tokens + decode requests)
  of recorded / modelled time, for the step time and the device time apart.
  With no recorded step in the band, the kind's median; with none of the
  kind, all steps'; with no recorded step at all, the model's time as is.
  The model's step time is taken as the loop uses it: in the overlapped loop a
  step is never shorter than its device time, so there ``max(step_time,
  device_time)``.

``matched`` and ``unmatched`` count the steps priced each way.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd

from core.scheduler.shape import StepShape
from schema.steprecord import SHAPE_COLUMNS
from sim.costs.base import GpuCostModel

KINDS = ("decode", "mixed", "prefill")
BAND_EDGES = (1, 2, 8, 32, 128, 512, 2048)
"""Lower edges of the bands of a count (batch size, step tokens): 1, 2-7, 8-31, ..., 2048+."""


def step_kind(prefill_tokens: int, decode_requests: int) -> str:
    """``decode`` (no prefill), ``prefill`` (no decode) or ``mixed``."""
    if prefill_tokens == 0:
        return "decode"
    return "mixed" if decode_requests else "prefill"


def band(n: int) -> str:
    """The band of ``BAND_EDGES`` that holds ``n`` (``0`` below the first)."""
    lower = [e for e in BAND_EDGES if e <= n]
    if not lower:
        return "0"
    i = BAND_EDGES.index(lower[-1])
    if i + 1 == len(BAND_EDGES):
        return f"{lower[-1]}+"
    upper = BAND_EDGES[i + 1] - 1
    return str(lower[-1]) if upper == lower[-1] else f"{lower[-1]}-{upper}"


def shapes_of(record: pd.DataFrame) -> list[StepShape]:
    """The ``StepShape`` of each recorded step."""
    columns = record[list(SHAPE_COLUMNS)].to_numpy(np.int64)
    return [StepShape(*(int(v) for v in row)) for row in columns]


def recorded_times(record: pd.DataFrame, overlap: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per recorded step: (step_time, device_time) as the strict or the overlapped loop asks
    them (see the module docstring)."""
    launched = record["launched"].to_numpy(np.float64)
    enqueued = record["enqueued"].to_numpy(np.float64)
    done = record["done"].to_numpy(np.float64)
    schedule_end = record["schedule_end"].to_numpy(np.float64)
    device = record["device_ms"].to_numpy(np.float64) / 1e3
    device = np.where(np.isfinite(device), device, done - launched)
    ready = np.where(np.isfinite(enqueued), enqueued, np.minimum(launched, done - device))
    host = np.maximum(ready - schedule_end, 0.0)
    step = host + device if overlap else done - schedule_end
    return step, device


class RecordedCostModel(GpuCostModel):
    """A step record's times for the steps it holds; ``wrapped``, corrected, for the others."""

    name = "recorded"

    def __init__(self, record: pd.DataFrame, wrapped: GpuCostModel, overlap: bool) -> None:
        self.wrapped = wrapped
        self.profile = wrapped.profile
        self.provenance = f"{len(record)} recorded steps; other steps: {wrapped.name}, corrected"
        self.overlap = overlap
        self.shapes = shapes_of(record)
        self.step_s, self.device_s = recorded_times(record, overlap)
        modelled = np.array([self.modelled(s) for s in self.shapes]).reshape(-1, 2)
        self.model_step_s, self.model_device_s = modelled[:, 0], modelled[:, 1]
        self._queues: dict[StepShape, deque[int]] = {}
        for i, shape in enumerate(self.shapes):
            self._queues.setdefault(shape, deque()).append(i)
        self._factors = {
            "step": _factors(self.shapes, self.step_s / self.model_step_s),
            "device": _factors(self.shapes, self.device_s / self.model_device_s),
        }
        self.matched = 0
        self.unmatched = 0

    def times(self, shape: StepShape) -> tuple[float, float]:
        queue = self._queues.get(shape)
        if queue:
            i = queue.popleft()
            self.matched += 1
            return float(self.step_s[i]), float(self.device_s[i])
        self.unmatched += 1
        step, device = self.modelled(shape)
        return step * self.factor("step", shape), device * self.factor("device", shape)

    def modelled(self, shape: StepShape) -> tuple[float, float]:
        """The wrapped model's (step time, device time) of ``shape``, the step time as the
        loop uses it (see the module docstring)."""
        step, device = self.wrapped.times(shape)
        return (max(step, device) if self.overlap else step), device

    def step_time(self, shape: StepShape) -> float:
        return self.times(shape)[0]

    def device_time(self, shape: StepShape) -> float:
        return self.times(shape)[1]

    def decode_times(self, batch: int, context_tokens: int, longest: int, k: int) -> np.ndarray:
        raise RuntimeError("recorded steps are priced one step at a time: set fast_forward off")

    def factor(self, which: str, shape: StepShape) -> float:
        """The correction of the wrapped model's ``which`` (``step`` or ``device``) time on
        steps like ``shape``."""
        factors = self._factors[which]
        kind = step_kind(shape.prefill_tokens, shape.decode_requests)
        tokens = band(shape.prefill_tokens + shape.decode_requests)
        for key in ((kind, tokens), (kind, ""), ("", "")):
            if key in factors:
                return factors[key]
        return 1.0

    def describe(self) -> dict[str, object]:
        return super().describe() | {
            "recorded_steps": len(self.shapes),
            "matched": self.matched,
            "unmatched": self.unmatched,
            "wrapped": self.wrapped.describe(),
        }


def _factors(shapes: list[StepShape], ratios: np.ndarray) -> dict[tuple[str, str], float]:
    """Median ratio per (kind, band of step tokens), per (kind, ""), and over all ("", "")."""
    groups: dict[tuple[str, str], list[float]] = {}
    for shape, ratio in zip(shapes, ratios, strict=True):
        if not np.isfinite(ratio):
            continue
        kind = step_kind(shape.prefill_tokens, shape.decode_requests)
        tokens = band(shape.prefill_tokens + shape.decode_requests)
        for key in ((kind, tokens), (kind, ""), ("", "")):
            groups.setdefault(key, []).append(float(ratio))
    return {key: float(np.median(values)) for key, values in groups.items()}
