"""Replicas sharing a GPU: how much a step's device time stretches beside another replica's step.

Replicas of one server on one GPU (``engine serve --dp N --dp-share-gpu``, one
process each, under MPS or time-sliced) run their steps side by side: each
step then takes longer than the profile's time, which was measured with the
GPU to itself. How much longer depends on both steps: two decode steps (small,
memory-bound kernels) interleave and lose little; a step beside a prefill or
mixed step (large GEMMs that fill the SMs) gets about half the GPU. So the
stretch is a table over (this step's kind, the other replica's step kind),
kinds being ``decode`` (no prefill tokens) and ``prefill`` (prefill tokens,
with or without decode rows)::

    device time = profile's device time * stretch[kind, other kind]

and 1 beside an idle GPU. ``fit_colocation`` measures the table from the step
records of replicas that shared a GPU (``engine serve --dp N --dp-share-gpu
--record-steps``) and the cost model that priced them alone:

- each recorded step's GPU interval: it starts when it was handed to the
  device (``enqueued``) or when the replica's previous step ended, whichever is
  later, and lasts its ``device_ms``;
- the other kind of a step is the kind that the other replicas' steps cover
  most of its interval with; a step less than half covered is ``alone``;
- ``stretch[kind, other]`` = the group's recorded device time over its
  modelled device time, both summed (the share a replay of such steps would be
  off by); ``alone`` rows are reported, not used.

The table is written as CSV (``kind,other,stretch,steps``); ``sim replay
--share-gpu --colocation FILE`` and ``sim validate --colocation FILE`` read it.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from schema.steprecord import REPLICA_COLUMN
from sim.costs.base import GpuCostModel
from sim.costs.recorded import RecordedCostModel

KINDS = ("decode", "prefill")
OTHERS = (*KINDS, "alone")
HEADER = ("kind", "other", "stretch", "steps")


def kind_of(prefill_tokens: int) -> str:
    """``prefill`` for a step with prefill tokens (mixed or not), else ``decode``."""
    return "prefill" if prefill_tokens > 0 else "decode"


@dataclass(frozen=True, slots=True)
class Colocation:
    """The stretch table (see the module docstring); ``steps`` counts the recorded steps behind
    each entry, ``source`` says where the table came from."""

    stretch: dict[tuple[str, str], float]
    steps: dict[tuple[str, str], int]
    source: str

    def missing(self) -> list[str]:
        """The pairs of kinds the simulator needs a stretch for that the table lacks."""
        return [f"{k} beside {o}" for k in KINDS for o in KINDS if (k, o) not in self.stretch]

    def of(self, kind: str, others: list[str]) -> float:
        """The stretch of a ``kind`` step beside the other replicas' steps of ``others``: each
        adds its excess over 1 (two others beside a step slow it twice as much)."""
        return 1.0 + sum(self.stretch[kind, other] - 1.0 for other in others)

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source,
            "stretch": {f"{k} beside {o}": round(v, 4) for (k, o), v in self.stretch.items()},
        }

    def write(self, path: Path) -> None:
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(HEADER)
            for (kind, other), value in sorted(self.stretch.items()):
                w.writerow((kind, other, f"{value:.6g}", self.steps.get((kind, other), 0)))


def read_colocation(path: Path | str) -> Colocation:
    """A table ``write`` wrote (or one written by hand with the same columns)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such co-location table")
    stretch: dict[tuple[str, str], float] = {}
    steps: dict[tuple[str, str], int] = {}
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(rows[0]) != HEADER:
        raise ValueError(f"{path}: a co-location table starts with the header {','.join(HEADER)}")
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != len(HEADER) or row[0] not in KINDS or row[1] not in OTHERS:
            raise ValueError(
                f"{path}:{i}: expected KIND,OTHER,STRETCH,STEPS with KIND in {KINDS} and "
                f"OTHER in {OTHERS}, got {row}"
            )
        try:
            stretch[row[0], row[1]] = float(row[2])
            steps[row[0], row[1]] = int(row[3])
        except ValueError:
            raise ValueError(f"{path}:{i}: stretch and steps must be numbers, got {row}") from None
        if not stretch[row[0], row[1]] > 0:
            raise ValueError(f"{path}:{i}: a stretch must be > 0, got {row[2]}")
    table = Colocation(stretch, steps, str(path))
    if table.missing():
        raise ValueError(f"{path}: the co-location table has no stretch for {table.missing()}")
    return table


def gpu_intervals(record: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each step's (start, end) on the GPU, in step order (see the module docstring)."""
    ready = record["enqueued"].to_numpy(np.float64)
    ready = np.where(np.isfinite(ready), ready, record["launched"].to_numpy(np.float64))
    device = record["device_ms"].to_numpy(np.float64) / 1e3
    start, end = np.empty(len(record)), np.empty(len(record))
    previous = -np.inf
    for i in range(len(record)):
        start[i] = max(ready[i], previous)
        end[i] = previous = start[i] + device[i]
    return start, end


def covered(
    start: np.ndarray, end: np.ndarray, other_start: np.ndarray, other_end: np.ndarray
) -> np.ndarray:
    """Per interval [start, end): the time the intervals [other_start, other_end) (sorted,
    disjoint) cover of it."""
    out = np.zeros(len(start))
    first = 0
    for i in range(len(start)):
        while first < len(other_end) and other_end[first] <= start[i]:
            first += 1
        j = first
        while j < len(other_start) and other_start[j] < end[i]:
            out[i] += max(0.0, min(end[i], other_end[j]) - max(start[i], other_start[j]))
            j += 1
    return out


def fit_colocation(records: list[pd.DataFrame], gpu: GpuCostModel, source: str) -> Colocation:
    """The stretch table of replicas that shared a GPU, from their step records (one frame
    each, every step timed on the device) and the model of their steps alone."""
    if len(records) < 2:
        raise ValueError("a co-location fit needs the step records of two replicas or more")
    timed = [
        r[np.isfinite(r["device_ms"].to_numpy(np.float64))].reset_index(drop=True) for r in records
    ]
    if any(not len(r) for r in timed):
        raise ValueError("a co-location fit needs steps timed on the device (device_ms)")
    spans = [gpu_intervals(r) for r in timed]
    recorded: dict[tuple[str, str], float] = {}
    modelled: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], int] = {}
    for k, record in enumerate(timed):
        start, end = spans[k]
        cover = {kind: np.zeros(len(record)) for kind in KINDS}
        for j, other in enumerate(timed):
            if j == k:
                continue
            kinds = np.array([kind_of(int(p)) for p in other["prefill_tokens"]])
            for kind in KINDS:
                mine = kinds == kind
                cover[kind] += covered(start, end, spans[j][0][mine], spans[j][1][mine])
        length = np.maximum(end - start, 1e-12)
        model = RecordedCostModel(record.drop(columns=[REPLICA_COLUMN], errors="ignore"), gpu, True)
        for i, prefill in enumerate(record["prefill_tokens"].to_numpy()):
            share = {kind: cover[kind][i] / length[i] for kind in KINDS}
            other = max(KINDS, key=lambda kind: share[kind])
            key = (kind_of(int(prefill)), other if sum(share.values()) >= 0.5 else "alone")
            recorded[key] = recorded.get(key, 0.0) + float(end[i] - start[i])
            modelled[key] = modelled.get(key, 0.0) + float(model.model_device_s[i])
            counts[key] = counts.get(key, 0) + 1
    stretch = {key: recorded[key] / modelled[key] for key in recorded if modelled[key] > 0}
    return Colocation(stretch, counts, source)
