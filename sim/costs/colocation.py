"""Replicas sharing a GPU: how much a step's device time stretches beside another replica's step.

Replicas of one server on one GPU (``engine serve --dp N --dp-share-gpu``, one
process each, under MPS or time-sliced) run their steps side by side: each
step then takes longer than the profile's time, which was measured with the
GPU to itself. How much longer depends on both steps: two decode steps (small,
memory-bound kernels) interleave and lose little; a step beside a prefill or
mixed step (large GEMMs that fill the SMs) gets about half the GPU, or less:
a small decode step beside a long prefill chunk waits for the chunk's GEMMs
kernel by kernel, a fixed delay that a larger decode step spreads over more
work. So the table, over (this step's kind, the other replica's step kind),
kinds being ``decode`` (no prefill tokens) and ``prefill`` (prefill tokens, with
or without decode rows), holds a stretch and a fixed time; a step that takes
``w`` alone, run wholly beside the other kind, takes::

    device time = stretch[kind, other] * w + fixed[kind, other]

(a factor ``stretch + fixed / w``, never below ``min(stretch, 1)``, and 1 beside
an idle GPU). A table with no fixed times (``--form ratio``) stretches every
step of a kind pair by one factor; measured on the H200 that factor fell from
3.1 to 2.1 for decode beside prefill between loads of 25x and 50x, as the
decode steps grew (``reports/cluster/``). ``fit_colocation``
measures the table from the step records of replicas that shared a GPU
(``engine serve --dp N --dp-share-gpu --record-steps``, one run or more) and the
cost model that priced them alone:

- each recorded step's GPU interval: it starts when it was handed to the
  device (``enqueued``) or when the replica's previous step ended, whichever is
  later, and lasts its ``device_ms``. A CPU engine's record has no device
  time: its replicas share the host's cores, and a step computes from the end
  of its ``schedule`` until ``done`` (the time the simulator's strict loop
  stretches), so the same table measures how CPU replicas slow each other;
- the other kind of a step is the kind that the other replicas' steps cover
  most of its interval with; a step less than half covered is ``alone``;
- per (kind, other) group, ``affine`` (the default) fits the recorded device
  time as ``stretch * modelled + fixed`` by least squares (which keeps the
  group's summed time), falling back to the ratio below for a group of fewer
  than ``MIN_AFFINE_STEPS`` steps, of steps of about one size alone
  (``MIN_AFFINE_SPREAD``) or a fit whose stretch is not positive;
  ``ratio`` takes the group's recorded device time over its modelled device
  time, both summed, and no fixed time; ``alone`` rows are reported, not used.

The table is written as CSV (``kind,other,stretch,fixed_ms,steps``; a table
without ``fixed_ms`` reads as fixed times of 0); ``sim replay --colocation
FILE`` and ``sim validate --colocation FILE`` read it.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from schema.steprecord import REPLICA_COLUMN
from sim.costs.base import GpuCostModel
from sim.costs.recorded import RecordedCostModel

KINDS = ("decode", "prefill")
OTHERS = (*KINDS, "alone")
HEADER = ("kind", "other", "stretch", "fixed_ms", "steps")
RATIO_HEADER = ("kind", "other", "stretch", "steps")
FORMS = ("affine", "ratio")
MIN_AFFINE_STEPS = 50
"""A group with fewer recorded steps is fitted as a ratio (no fixed time)."""
MIN_AFFINE_SPREAD = 0.1
"""Nor is a fixed time fitted to a group whose modelled times spread less than this
(standard deviation over mean): steps of one size cannot tell a fixed time from a stretch."""


def kind_of(prefill_tokens: int) -> str:
    """``prefill`` for a step with prefill tokens (mixed or not), else ``decode``."""
    return "prefill" if prefill_tokens > 0 else "decode"


@dataclass(frozen=True, slots=True)
class Colocation:
    """The table (see the module docstring): ``stretch`` and ``fixed`` (seconds) per pair of
    kinds; ``steps`` counts the recorded steps behind each entry, ``source`` says where the
    table came from."""

    stretch: dict[tuple[str, str], float]
    steps: dict[tuple[str, str], int]
    source: str
    fixed: dict[tuple[str, str], float] = field(default_factory=dict)

    def missing(self) -> list[str]:
        """The pairs of kinds the simulator needs a stretch for that the table lacks."""
        return [f"{k} beside {o}" for k in KINDS for o in KINDS if (k, o) not in self.stretch]

    def factor(self, kind: str, other: str, work: float) -> float:
        """How much a ``kind`` step that takes ``work`` seconds alone stretches wholly beside
        an ``other`` step: ``stretch + fixed / work``, not below ``min(stretch, 1)``."""
        stretch = self.stretch[kind, other]
        fixed = self.fixed.get((kind, other), 0.0)
        if not fixed:
            return stretch
        return max(stretch + fixed / max(work, 1e-9), min(stretch, 1.0))

    def of(self, kind: str, others: list[str], work: float) -> float:
        """The stretch of a ``kind`` step that takes ``work`` alone beside the other replicas'
        steps of ``others``: each adds its excess over 1 (two others beside a step slow it
        twice as much)."""
        return 1.0 + sum(self.factor(kind, other, work) - 1.0 for other in others)

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source,
            "stretch": {f"{k} beside {o}": round(v, 4) for (k, o), v in self.stretch.items()},
            "fixed_ms": {f"{k} beside {o}": round(v * 1e3, 4) for (k, o), v in self.fixed.items()},
        }

    def write(self, path: Path) -> None:
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(HEADER)
            for (kind, other), value in sorted(self.stretch.items()):
                fixed_ms = self.fixed.get((kind, other), 0.0) * 1e3
                w.writerow((kind, other, f"{value:.6g}", f"{fixed_ms:.6g}",
                            self.steps.get((kind, other), 0)))  # fmt: skip


def read_colocation(path: Path | str) -> Colocation:
    """A table ``write`` wrote (or one written by hand with the same columns)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such co-location table")
    stretch: dict[tuple[str, str], float] = {}
    fixed: dict[tuple[str, str], float] = {}
    steps: dict[tuple[str, str], int] = {}
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    header = tuple(rows[0]) if rows else ()
    if header not in (HEADER, RATIO_HEADER):
        raise ValueError(
            f"{path}: a co-location table starts with the header {','.join(HEADER)} "
            f"(or {','.join(RATIO_HEADER)}: no fixed times)"
        )
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != len(header) or row[0] not in KINDS or row[1] not in OTHERS:
            raise ValueError(
                f"{path}:{i}: expected {','.join(header).upper()} with KIND in {KINDS} and "
                f"OTHER in {OTHERS}, got {row}"
            )
        values = dict(zip(header, row, strict=True))
        key = (row[0], row[1])
        try:
            stretch[key] = float(values["stretch"])
            fixed[key] = float(values.get("fixed_ms", 0.0)) / 1e3
            steps[key] = int(values["steps"])
        except ValueError:
            raise ValueError(f"{path}:{i}: the stretch, fixed time and steps must be numbers, "
                             f"got {row}") from None  # fmt: skip
        if not stretch[key] > 0:
            raise ValueError(f"{path}:{i}: a stretch must be > 0, got {values['stretch']}")
    table = Colocation(stretch, steps, str(path), fixed)
    if table.missing():
        raise ValueError(f"{path}: the co-location table has no stretch for {table.missing()}")
    return table


def host_timed(record: pd.DataFrame) -> bool:
    """Whether a step record has no device time at all: a CPU engine's, whose steps compute
    on the host from the end of ``schedule`` until ``done``."""
    return not np.isfinite(record["device_ms"].to_numpy(np.float64)).any()


def timed_steps(record: pd.DataFrame) -> pd.DataFrame:
    """The steps of a record that have a time on the device (a CPU record's: all of them)."""
    if host_timed(record):
        return record.reset_index(drop=True)
    return record[np.isfinite(record["device_ms"].to_numpy(np.float64))].reset_index(drop=True)


def gpu_intervals(record: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each step's (start, end) on the GPU, in step order (see the module docstring); a CPU
    record's, [``schedule_end``, ``done``)."""
    if host_timed(record):
        return (record["schedule_end"].to_numpy(np.float64), record["done"].to_numpy(np.float64))
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
    start: np.ndarray,
    end: np.ndarray,
    other_start: np.ndarray,
    other_end: np.ndarray,
    weight: np.ndarray | None = None,
) -> np.ndarray:
    """Per interval [start, end): the time the intervals [other_start, other_end) (sorted,
    disjoint) cover of it, each other interval's part times its ``weight`` (default 1)."""
    weights = np.ones(len(other_start)) if weight is None else weight
    out = np.zeros(len(start))
    first = 0
    for i in range(len(start)):
        while first < len(other_end) and other_end[first] <= start[i]:
            first += 1
        j = first
        while j < len(other_start) and other_start[j] < end[i]:
            overlap = min(end[i], other_end[j]) - max(start[i], other_start[j])
            out[i] += max(0.0, overlap) * weights[j]
            j += 1
    return out


def _kinds_beside(
    timed: list[pd.DataFrame], gpu: GpuCostModel
) -> tuple[list[tuple[str, str]], list[float], list[float]]:
    """Per step of one run's replicas: its (kind, other kind), its time on the GPU as recorded
    and its modelled device time alone (see the module docstring)."""
    spans = [gpu_intervals(r) for r in timed]
    keys: list[tuple[str, str]] = []
    recorded: list[float] = []
    modelled: list[float] = []
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
            keys.append((kind_of(int(prefill)), other if sum(share.values()) >= 0.5 else "alone"))
            recorded.append(float(end[i] - start[i]))
            modelled.append(float(model.model_device_s[i]))
    return keys, recorded, modelled


def fit_colocation(
    runs: list[list[pd.DataFrame]], gpu: GpuCostModel, source: str, form: str = "affine"
) -> Colocation:
    """The table of replicas that shared a GPU, from the step records of one run or more (per
    run, one frame per replica, every step timed on the device) and the model of their steps
    alone, in ``form`` (``affine`` or ``ratio``: the module docstring)."""
    if form not in FORMS:
        raise ValueError(f"unknown co-location form {form!r}; known: {', '.join(FORMS)}")
    stretch: dict[tuple[str, str], float] = {}
    fixed: dict[tuple[str, str], float] = {}
    groups = _groups(runs, gpu)
    for key, (recorded, modelled) in groups.items():
        if not modelled.sum() > 0:
            continue
        stretch[key], fixed[key] = float(recorded.sum() / modelled.sum()), 0.0
        spread = float(modelled.std() / modelled.mean())
        if (
            form == "affine"
            and key[1] != "alone"
            and len(recorded) >= MIN_AFFINE_STEPS
            and (spread >= MIN_AFFINE_SPREAD)
        ):
            design = np.vstack([modelled, np.ones(len(modelled))]).T
            (slope, intercept), *_ = np.linalg.lstsq(design, recorded, rcond=None)
            if slope > 0:
                stretch[key], fixed[key] = float(slope), float(intercept)
    counts = {key: len(rec) for key, (rec, _) in groups.items()}
    return Colocation(stretch, counts, source, fixed)


def check_colocation(
    table: Colocation, runs: list[list[pd.DataFrame]], gpu: GpuCostModel
) -> dict[tuple[str, str], tuple[int, float, float]]:
    """A table against recorded runs (as ``fit_colocation`` takes them): per pair of kinds,
    the steps, their recorded device time and the table's price of them (each step's time
    alone stretched wholly beside the other kind; alone: as modelled), seconds, summed. It
    tells the table's error on the plans that ran from what a simulation adds to it."""
    out: dict[tuple[str, str], tuple[int, float, float]] = {}
    for (kind, other), (recorded, modelled) in sorted(_groups(runs, gpu).items()):
        if other == "alone":
            priced = modelled
        else:
            priced = np.array([w * table.factor(kind, other, w) for w in modelled])
        out[kind, other] = (len(recorded), float(recorded.sum()), float(priced.sum()))
    return out


def _groups(
    runs: list[list[pd.DataFrame]], gpu: GpuCostModel
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """The runs' steps per (kind, other kind): recorded device time and modelled time alone."""
    groups: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for records in runs:
        if len(records) < 2:
            raise ValueError("a co-location fit needs the step records of two replicas or more")
        timed = [timed_steps(r) for r in records]
        if any(not len(r) for r in timed):
            raise ValueError("a co-location fit needs steps timed on the device (device_ms)")
        for key, one_rec, one_mod in zip(*_kinds_beside(timed, gpu), strict=True):
            group = groups.setdefault(key, ([], []))
            group[0].append(one_rec)
            group[1].append(one_mod)
    return {key: (np.array(rec), np.array(mod)) for key, (rec, mod) in groups.items()}
