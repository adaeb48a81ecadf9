"""Replicas of a simulated cluster that share one GPU (``sim replay --colocation FILE``).

Each replica's loop prices its steps alone (the profile), then asks its
``Seat`` how much the other replicas' steps stretch a step of its kind and
time alone that starts at ``start`` (``sim.costs.colocation``: the table over
this step's and the others' kinds). The GPU keeps each replica's last few steps (``KEPT``: with
overlap one runs while the next is queued behind it), each with its kind, its
interval and what it was priced beside. A replica with a step running at
``start`` runs beside the new step; one without is idle then.

A step is priced once, at its launch, over what is on the GPU then: its work
(its time alone) advances at ``1 / stretch`` of the kinds running beside it,
and the kinds change where the others' known steps (running or queued) start
and end, so a step that outlasts the prefill chunk beside it is stretched only
while the chunk runs. Past a busy replica's last known step, that replica is
taken to go on with steps of the same kind; an idle one (its loop waiting for
requests) runs nothing. The pieces a step was priced over are kept. What
differs later is settled when it happens: a replica launching a step over a
piece of another's step that was priced beside something else (an idle
replica, or a step of another kind), or going idle under pieces priced beside
its steps, charges that replica the difference over their overlap::

    debt += overlap * (factor[kind, new kind] / factor[kind, kind priced beside] - 1)

(the work done in the overlap at the stretch it was priced at, done at the new one;
each factor the table's for that step's time alone; beside an idle replica, 1),
paid on the charged replica's next step (its device time grows by the debt, run
first; a credit shrinks it, to no less than ``MIN_SHARE``). So both steps of a
pair are stretched for the time they share, the later one at its launch, the
earlier one a step late.

Decode runs, priced ahead at one stretch, hold while what they were priced
beside holds: a run ends where another replica's known step starts or ends (the
loop then prices the next step), and a step launched beside a run that was
priced beside something else, or a replica going idle under it, cuts that run
after its running step (its next steps are priced anew) and charges it for that
step only.
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
class Piece:
    """A stretch of a step's time priced beside the same steps: until when, and the kind
    of each other replica's step it was priced beside (an idle replica is absent)."""

    until: float
    beside: dict[int, str]
    settled: bool = False  # a debt paid: time already stretched, never settled again


@dataclass(frozen=True, slots=True)
class OnGpu:
    """A replica's step on the GPU and the pieces of its time, each with the kinds of the
    steps it was priced beside."""

    kind: str  # decode or prefill
    work: float  # its device time alone (a decode run's: its first step's), seconds
    start: float  # on the GPU, seconds
    end: float
    pieces: tuple[Piece, ...]  # in time order; the last one holds to the step's end
    ends: np.ndarray | None = None  # a decode run's step ends (its last is ``end``)

    def priced(self, replica: int, start: float, end: float) -> list[tuple[float, str | None]]:
        """The parts of [start, end) inside this step, each with the kind of ``replica``'s
        step it was priced beside (None: idle)."""
        out: list[tuple[float, str | None]] = []
        begin = self.start
        for i, piece in enumerate(self.pieces):
            until = self.end if i == len(self.pieces) - 1 else min(piece.until, self.end)
            overlap = min(until, end) - max(begin, start)
            if overlap > 0 and not piece.settled:
                out.append((overlap, piece.beside.get(replica)))
            begin = until
        return out

    def cut(self, t: float) -> OnGpu:
        """This step as it runs once a cut at ``t`` ends a decode run after its running step
        (after its first, if it starts after ``t``)."""
        if self.ends is None or t >= self.end:
            return self
        i = min(int(self.ends.searchsorted(t, side="right")), len(self.ends) - 1)
        end = float(self.ends[i])
        return OnGpu(self.kind, self.work, self.start, end, self.pieces, self.ends[: i + 1])


def credited(stretched: float, credit: float) -> float:
    """A step's device time shrunk by a ``credit`` (negative debt), to no less than
    ``MIN_SHARE`` of it."""
    return max(stretched + credit, MIN_SHARE * stretched)


def debt_first(start: float, debt: float) -> tuple[Piece, ...]:
    """The piece of a step starting at ``start`` that pays a debt first: time stretched
    when the debt was run up, so never settled again (none for no debt or a credit)."""
    return (Piece(start + debt, {}, settled=True),) if debt > 0 else ()


class SharedGpu:
    """One GPU and the replicas on it: their recent steps, the debts that steps launched
    beside them ran up, and the cuts that end their loops' decode runs."""

    def __init__(self, colocation: Colocation, replicas: int) -> None:
        self.colocation = colocation
        self.steps: list[list[OnGpu]] = [[] for _ in range(replicas)]
        self.debt = [0.0] * replicas
        self.idle = [True] * replicas  # waiting for requests: runs nothing past its steps
        self.cuts: list[Callable[[], None]] = [lambda: None] * replicas

    def seat(self, replica: int) -> Seat:
        return Seat(self, replica)


class Seat:
    """A replica's place on a ``SharedGpu``: the stretch of its steps, and their settling."""

    def __init__(self, gpu: SharedGpu, replica: int) -> None:
        self.gpu = gpu
        self.replica = replica

    def stretch(self, kind: str, start: float, work: float) -> tuple[float, float, dict[int, str]]:
        """The stretch of a ``kind`` step that takes ``work`` alone starting at ``start`` (a
        decode run's), until when it holds (the next start or end of another replica's known
        step; inf: none), and what it runs beside (``beside_at``)."""
        beside = self.beside_at(start)
        until = min((e for e in self._edges() if e > start), default=math.inf)
        return self.gpu.colocation.of(kind, list(beside.values()), work), until, beside

    def _edges(self) -> list[float]:
        """Where the other replicas' known steps start and end."""
        return [
            e
            for j, steps in enumerate(self.gpu.steps)
            if j != self.replica
            for step in steps
            for e in (step.start, step.end)
        ]

    def beside_at(self, t: float) -> dict[int, str]:
        """The kind of each other replica's step at ``t``: a known step's, or past a busy
        replica's last known step, the kind of that step."""
        gpu = self.gpu
        out: dict[int, str] = {}
        for j, steps in enumerate(gpu.steps):
            if j == self.replica or not steps:
                continue
            running = [step.kind for step in steps if step.start <= t < step.end]
            if running:
                out[j] = running[0]
            elif not gpu.idle[j] and t >= steps[-1].end:
                out[j] = steps[-1].kind
        return out

    def take_debt(self) -> float:
        """This replica's debt (a credit: negative), now cleared."""
        debt, self.gpu.debt[self.replica] = self.gpu.debt[self.replica], 0.0
        return debt

    def pay(self, stretched: float) -> tuple[float, float]:
        """A step's stretched device time with this replica's debt paid, and the part of it
        that is the debt, run first (0 for a credit, which shrinks the step to no less than
        ``MIN_SHARE`` of it)."""
        debt = self.take_debt()
        if debt >= 0:
            return stretched + debt, debt
        return credited(stretched, debt), 0.0

    def price(self, kind: str, start: float, device: float) -> float:
        """The device time of a ``kind`` step launched at ``start`` that takes ``device``
        alone: its work advancing at ``1 / stretch`` of what runs beside it, piece by piece
        (the module docstring), this replica's debt paid; the step is then on the GPU."""
        debt = self.take_debt()
        pieces = list(debt_first(start, debt))
        t, work = start + max(debt, 0.0), device
        edges = sorted({e for e in self._edges() if e > t})
        for edge in [*edges, math.inf]:
            beside = self.beside_at(t)
            factor = self.gpu.colocation.of(kind, list(beside.values()), device)
            pieces.append(Piece(edge, beside))
            if work * factor <= edge - t:
                t += work * factor
                break
            work -= (edge - t) / factor
            t = edge
        stretched = t - start if debt >= 0 else credited(t - start, debt)
        self.occupy(kind, device, start, start + stretched, tuple(pieces))
        return stretched

    def occupy(
        self,
        kind: str,
        work: float,
        start: float,
        end: float,
        pieces: tuple[Piece, ...],
        ends: np.ndarray | None = None,
    ) -> None:
        """This replica runs a ``kind`` step that takes ``work`` alone (a decode run: steps
        ending at ``ends``, ``work`` its first's) over [start, end), priced over ``pieces``;
        the others' steps it overlaps are settled (module docstring)."""
        self.settle(start, end, kind)
        self.gpu.idle[self.replica] = False
        mine = self.gpu.steps[self.replica]
        mine.append(OnGpu(kind, work, start, end, pieces, ends))
        del mine[:-KEPT]

    def rest(self, t: float) -> None:
        """This replica waits for requests from ``t``: the others' steps priced beside its
        steps past ``t`` are settled (module docstring)."""
        self.settle(t, math.inf, None)
        self.gpu.idle[self.replica] = True

    def settle(self, start: float, end: float, kind: str | None) -> None:
        """The others' steps' pieces over [start, end) priced beside other than this
        replica's ``kind`` (None: idle) run up the difference as debt; a decode run so
        affected is cut after its running step."""
        gpu, me = self.gpu, self.replica
        factor = gpu.colocation.factor
        for j, steps in enumerate(gpu.steps):
            if j == me:
                continue
            for i, step in enumerate(steps):
                parts = [p for p in step.priced(me, start, end) if p[1] != kind]
                if not parts:
                    continue
                if step.ends is not None:
                    step = steps[i] = step.cut(start)
                    gpu.cuts[j]()
                    parts = [p for p in step.priced(me, start, end) if p[1] != kind]
                now = 1.0 if kind is None else factor(step.kind, kind, step.work)
                for overlap, priced in parts:
                    was = 1.0 if priced is None else factor(step.kind, priced, step.work)
                    gpu.debt[j] += overlap * (now / was - 1.0)

    def trim(self, end: float) -> None:
        """This replica's last step (a decode run, cut) ends at ``end`` instead."""
        mine = self.gpu.steps[self.replica]
        if mine and mine[-1].ends is not None and end < mine[-1].end:
            mine[-1] = mine[-1].cut(end - 1e-12)
