"""Replicas of a simulated cluster that share one GPU (``sim replay --colocation FILE``).

Each replica's loop prices its steps alone (the profile), then asks its
``Seat`` how much the other replicas' steps stretch a step of its kind that
starts at ``start`` (``sim.costs.colocation``: the table over this step's and
the others' kinds). The GPU keeps each replica's last few steps (``KEPT``: with
overlap one runs while the next is queued behind it), each with its kind, its
interval and what it was priced beside. A replica with a step running at
``start`` runs beside the new step; one without is idle then.

A step is priced once, at its launch, beside what runs then. What starts
beside it later is settled when it starts: a replica launching a step over
another's step that was priced beside something else (an idle replica, or a
step of another kind) charges that replica the difference over their
overlap::

    debt += overlap * (stretch[kind, new kind] - stretch[kind, kind priced beside])

(beside an idle replica the stretch is 1), paid on the charged replica's next
step (its device time grows by the debt; a credit shrinks it, to no less than
``MIN_SHARE``). So both steps of a pair are stretched for the time they share,
the later one at its launch, the earlier one a step late.

Decode runs, priced ahead, hold while what they were priced beside holds: a
run ends at the earliest end of the others' steps that stretch it (the loop
then prices the next step), and a step launched beside a run that was priced
beside something else cuts that run after its running step (its next steps
are priced beside the new one) and charges it for that step only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.costs.colocation import Colocation

KEPT = 3
"""Steps kept per replica: the one running, the one queued behind it, and one more."""
MIN_SHARE = 0.5
"""A credit shrinks a step's device time to no less than this share of it."""


@dataclass(frozen=True, slots=True)
class OnGpu:
    """A replica's step on the GPU and the kinds of the steps it was priced beside."""

    kind: str  # decode or prefill
    start: float  # on the GPU, seconds
    end: float
    beside: dict[int, str]  # replica -> the kind of its step this one was priced beside
    ends: np.ndarray | None = None  # a decode run's step ends (its last is ``end``)

    def cut(self, t: float) -> OnGpu:
        """This step as it runs once a cut at ``t`` ends a decode run after its running step
        (after its first, if it starts after ``t``)."""
        if self.ends is None or t >= self.end:
            return self
        i = min(int(self.ends.searchsorted(t, side="right")), len(self.ends) - 1)
        return OnGpu(self.kind, self.start, float(self.ends[i]), self.beside, self.ends[: i + 1])


class SharedGpu:
    """One GPU and the replicas on it: their recent steps, the debts that steps launched
    beside them ran up, and the cuts that end their loops' decode runs."""

    def __init__(self, colocation: Colocation, replicas: int) -> None:
        self.colocation = colocation
        self.steps: list[list[OnGpu]] = [[] for _ in range(replicas)]
        self.debt = [0.0] * replicas
        self.cuts: list[Callable[[], None]] = [lambda: None] * replicas

    def seat(self, replica: int) -> Seat:
        return Seat(self, replica)


class Seat:
    """A replica's place on a ``SharedGpu``: the stretch of its steps, and their settling."""

    def __init__(self, gpu: SharedGpu, replica: int) -> None:
        self.gpu = gpu
        self.replica = replica

    def stretch(self, kind: str, start: float) -> tuple[float, float, dict[int, str]]:
        """The stretch of a ``kind`` step starting at ``start``, until when it holds (the
        earliest end of the steps it runs beside; inf: none), and what it runs beside: each
        other replica's step running at ``start``, by its kind."""
        beside: dict[int, str] = {}
        until = math.inf
        for j, steps in enumerate(self.gpu.steps):
            if j == self.replica:
                continue
            for step in steps:
                if step.start <= start < step.end:
                    beside[j] = step.kind
                    until = min(until, step.end)
        return self.gpu.colocation.of(kind, list(beside.values())), until, beside

    def pay(self, device: float) -> float:
        """A step's (stretched) device time with this replica's debt paid."""
        debt, self.gpu.debt[self.replica] = self.gpu.debt[self.replica], 0.0
        return max(device + debt, MIN_SHARE * device)

    def price(self, kind: str, start: float, device: float) -> float:
        """The device time of a ``kind`` step launched at ``start`` that takes ``device``
        alone: stretched, this replica's debt paid; the step is then on the GPU."""
        factor, _, beside = self.stretch(kind, start)
        stretched = self.pay(device * factor)
        self.occupy(kind, start, start + stretched, beside)
        return stretched

    def occupy(
        self,
        kind: str,
        start: float,
        end: float,
        beside: dict[int, str],
        ends: np.ndarray | None = None,
    ) -> None:
        """This replica runs a ``kind`` step (a decode run: steps ending at ``ends``) over
        [start, end), priced ``beside``; the others' steps it overlaps are settled (module
        docstring)."""
        gpu, me = self.gpu, self.replica
        table = gpu.colocation.stretch
        for j, steps in enumerate(gpu.steps):
            if j == me:
                continue
            for i, step in enumerate(steps):
                priced = step.beside.get(me)
                if step.end <= start or step.start >= end or priced == kind:
                    continue
                if step.ends is not None:
                    step = steps[i] = step.cut(start)
                    gpu.cuts[j]()
                overlap = min(step.end, end) - max(step.start, start)
                if overlap > 0:
                    was = 1.0 if priced is None else table[step.kind, priced]
                    gpu.debt[j] += overlap * (table[step.kind, kind] - was)
        mine = gpu.steps[me]
        mine.append(OnGpu(kind, start, end, beside, ends))
        del mine[:-KEPT]

    def trim(self, end: float) -> None:
        """This replica's last step (a decode run, cut) ends at ``end`` instead."""
        mine = self.gpu.steps[self.replica]
        if mine and mine[-1].ends is not None and end < mine[-1].end:
            mine[-1] = mine[-1].cut(end - 1e-12)
