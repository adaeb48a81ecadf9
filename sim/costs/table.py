"""The table cost model: piecewise-linear fits to the step times of a measured profile.

Three groups of a profile's step rows (of the configured TP degree) get one
``PiecewiseFit`` each (``sim.costs.fit``):

- pure decode steps: spine = decode batch size, plus terms in the context the
  batch reads (``decode_context``) and in that context padded to the longest
  request (``decode_padded``: a kernel that pads its decode batch pays for it; a paged
  kernel does not; the torch backend pads within batches of rows sorted by context, at
  most twofold, so it pays a share of it). On a GPU with CUDA graphs a decode step
  runs the graph of the next captured batch size, so its time is a step
  function of the batch size; a knot at every measured batch size follows it.
- steps with prefill (pure or mixed with decodes or verify spans): spine = tokens
  in the step (prefill tokens + decode requests; knots at the rows that prefill
  one sequence alone), plus terms in the prefill's query-key pairs, the decodes'
  context (plain and padded) and the rows sampled beside the decodes
  (``extend_sampled``: a chunk's last row, every row of a verify span). That last
  term tells a newcomer's chunk prefilled beside verify spans (speculative
  decoding) from a prefill of as many tokens: on the CPU each span costs about
  as much as a chunk of many tokens, and without it a profile's rows of that
  kind, as knots, bent the spine and put held-out prefills 23 % off. A term in
  the number of decode requests would repeat the spine; with the few mixed rows
  a profile has it made the fit wild on held-out mixed steps (up to 5x off on
  the H200 profile).
- verify steps (speculative decoding: every row of every extend sampled, as a
  slot's token and its drafts are): spine = tokens in the step (knots at every
  row), plus a term in the query-key pairs. A verify step of n slots runs n
  short extends, and on the torch backend each costs about as much as a
  prefill chunk of many tokens: priced by the prefill fit, a chat prompt's
  40-token chunk cost what 8 slots of 5 tokens did, 60 % too much.

A group the profile lacks is priced by another's fit (verify by prefill, prefill
and decode by each other). No step is predicted faster than the fastest measured
step of its group.

A term whose feature the group's rows do not vary (the rows sampled beside the
decodes, where a profile measures no verify spans and prefills one chunk at a
time) is left out: the intercept is all the rows can tell of it.

Each group is fitted twice: to the rows' wall times (``step_time``: the step
as the strict loop runs it) and to their device times (``device_time``: the
step's period when steps are launched back to back, as the overlapped loop
runs them). A profile without separate device times gets one fit for both.
Where every fitted row has a launch time (``launch_s``), a third fit gives
``launch_time``: how long the host is held in the step's launch. Rows with
``split = holdout`` stay out of the fit; the fit's relative error on them (and
on the rows it was fitted to) is printed by ``engine profile``, recorded in the
provenance and in ``describe()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from core.scheduler.shape import StepShape
from sim.costs.base import GpuCostModel
from sim.costs.fit import PiecewiseFit, relative_errors
from sim.costs.profile import Profile, ProfileError, ProfileRow
from sim.costs.reach import Reach, measured_reach


@dataclass(frozen=True, slots=True)
class StepGroup:
    """Which rows a fit covers and which shape fields feed it."""

    name: str
    spine: tuple[str, ...]  # summed into the spine variable
    extras: tuple[str, ...]
    spine_from_pure: bool  # knots only at rows that prefill one sequence alone

    def spine_of(self, shape: StepShape) -> int:
        """The spine variable of ``shape``: the sum of its ``spine`` fields."""
        return sum(getattr(shape, f) for f in self.spine)

    def extras_of(self, shape: StepShape) -> tuple[int, ...]:
        return tuple(getattr(shape, f) for f in self.extras)

    def varying(self, shapes: list[StepShape]) -> StepGroup:
        """This group less the extras that take one value over ``shapes``."""
        keep = tuple(f for f in self.extras if len({getattr(s, f) for s in shapes}) > 1)
        return self if keep == self.extras else replace(self, extras=keep)

    def columns(self, shapes: list[StepShape]) -> tuple[np.ndarray, np.ndarray]:
        x = np.array([sum(getattr(s, f) for f in self.spine) for s in shapes], dtype=np.float64)
        extras = np.array(
            [[getattr(s, f) for f in self.extras] for s in shapes], dtype=np.float64
        ).reshape(len(shapes), len(self.extras))
        return x, extras


DECODE = StepGroup("decode", ("decode_requests",), ("decode_context", "decode_padded"), False)
PREFILL = StepGroup(
    "prefill",
    ("prefill_tokens", "decode_requests"),
    ("prefill_attention", "decode_context", "decode_padded", "extend_sampled"),
    True,
)
GROWING = ("decode_context", "decode_padded")
"""Features that grow by the batch size with each step of a decode run."""
VERIFY = StepGroup("verify", ("prefill_tokens", "decode_requests"), ("prefill_attention",), False)
GROUPS = (DECODE, VERIFY, PREFILL)


def group_of(shape: StepShape) -> str:
    """The group that prices ``shape``: ``decode`` without prefill tokens, ``verify`` when
    every row is sampled (verify spans, and decodes beside them), else ``prefill``."""
    if not shape.prefill_tokens:
        return "decode"
    if shape.sampled == shape.prefill_tokens + shape.decode_requests:
        return "verify"
    return "prefill"


MEASURES: dict[str, Callable[[ProfileRow], float]] = {
    "wall": lambda r: r.duration_s,
    "device": lambda r: r.device_time,
    "launch": lambda r: r.launch_s if r.launch_s is not None else math.nan,
}
"""The times a group can be fitted to (``launch`` only where every row has one)."""
RUN_ROWS = 64
"""Rows of the design kept per batch size: runs up to this long reuse it."""


@dataclass(frozen=True, slots=True)
class GroupFit:
    group: StepGroup
    fit: PiecewiseFit
    floor: float  # the fastest measured step of the group
    designs: dict[float, np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    """Per spine value priced so far (a decode run's batch): a design of ``RUN_ROWS`` rows
    whose spine columns are filled; a run's extra columns are written over."""
    spine_sums: dict[float, float] = field(default_factory=dict, compare=False, repr=False)
    """``fit.spine_one`` of each spine value priced so far (a single step's)."""
    coef: np.ndarray = field(init=False, compare=False, repr=False)
    growing: tuple[int, ...] = field(init=False, compare=False, repr=False)
    """The design columns of the ``GROWING`` features."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "coef", np.asarray(self.fit.coef))
        p = len(self.coef) - len(self.group.extras)
        growing = tuple(p + i for i, f in enumerate(self.group.extras) if f in GROWING)
        object.__setattr__(self, "growing", growing)

    @staticmethod
    def of(group: StepGroup, rows: list[ProfileRow], measure: str = "wall") -> GroupFit:
        """The fit to ``rows``' ``measure``: wall, device or launch times."""
        shapes = [r.shape for r in rows]
        group = group.varying(shapes)
        x, extras = group.columns(shapes)
        y = np.array([MEASURES[measure](r) for r in rows], dtype=np.float64)
        pure = (
            np.array([s.decode_requests == 0 and s.extend_sampled <= 1 for s in shapes])
            if group.spine_from_pure
            else None
        )
        return GroupFit(group, PiecewiseFit.fit(x, extras, y, pure), float(y.min()))

    def time(self, shape: StepShape) -> float:
        """``max(fit.predict_one, floor)``: the same sums, the spine's kept per spine value."""
        g = self.group
        x = g.spine_of(shape)
        spine = self.spine_sums.get(x)
        if spine is None:
            spine = self.spine_sums[x] = self.fit.spine_one(x)
        return max(self.fit.add_extras(spine, g.extras_of(shape)), self.floor)

    def run_times(self, shape: StepShape, growth: np.ndarray) -> np.ndarray:
        """``max(fit.predict, floor)`` of ``len(growth)`` steps of ``shape`` whose ``GROWING``
        features grow by ``growth`` (the same design matrix as ``fit.predict``'s)."""
        g = self.group
        x = float(g.spine_of(shape))
        k = len(growth)
        design = self.designs.get(x)
        if design is None:
            design = self.designs[x] = self._design(x, RUN_ROWS)
        if k <= RUN_ROWS:
            design = design[:k]
        else:
            design = self._design(x, k)
        p = len(self.coef) - len(g.extras)
        for column, value in zip(range(p, p + len(g.extras)), g.extras_of(shape), strict=True):
            if column in self.growing:
                np.add(growth, float(value), out=design[:, column])
            else:
                design[:, column] = float(value)
        times: np.ndarray = design @ self.coef
        np.maximum(times, self.floor, out=times)
        return times

    def _design(self, x: float, rows: int) -> np.ndarray:
        """A C-ordered design of ``rows`` rows of spine value ``x``; extra columns unset."""
        spine = self.fit.spine(np.array([x]))
        design = np.empty((rows, len(self.coef)))
        design[:, : spine.shape[1]] = spine
        return design

    def describe(self) -> dict[str, Any]:
        return {
            "spine": "+".join(self.group.spine),
            "knots": list(self.fit.knots),
            "extras": list(self.group.extras),
            "coef": list(self.fit.coef),
            "floor_s": self.floor,
        }


class Fits(NamedTuple):
    """One measure's fit per group (a group the profile lacks priced by another's)."""

    decode: GroupFit
    verify: GroupFit
    prefill: GroupFit

    def of(self, shape: StepShape) -> GroupFit:
        return getattr(self, group_of(shape))  # type: ignore[no-any-return]


class TableCostModel(GpuCostModel):
    name = "table"

    def __init__(self, profile: Profile, tp: int = 1) -> None:
        rows = [r for r in profile.steps if r.tp == tp]
        if not rows:
            have = sorted({r.tp for r in profile.steps})
            raise ProfileError(f"{profile.path}: no step rows for tp={tp} (have tp {have})")
        fit_rows = [r for r in rows if r.split == "fit"]
        if not fit_rows:
            raise ProfileError(f"{profile.path}: every step row for tp={tp} is held out")
        self.wall = self.device = self._fits(fit_rows, "wall")
        separate = any(r.device_time != r.duration_s for r in rows)
        if separate:
            self.device = self._fits(fit_rows, "device")
        self.launches: Fits | None = None
        if all(r.launch_s is not None for r in fit_rows):
            self.launches = self._fits(fit_rows, "launch")
        self.tp = tp
        self.profile = profile.path
        self.reach = measured_reach([r.shape for r in rows])
        holdout = [r for r in rows if r.split == "holdout"]
        self.errors = {"fit": self.errors_on(fit_rows), "holdout": self.errors_on(holdout)}
        if separate:
            self.errors["device holdout"] = self.errors_on(holdout, device=True)
        self.provenance = (
            f"piecewise-linear fit to {len(fit_rows)} step rows (tp={tp}) of {profile.path}; "
            f"{self.error_text()}: {profile.provenance_text()}"
        )

    @staticmethod
    def _fits(rows: list[ProfileRow], measure: str) -> Fits:
        """Each group's fit to ``rows``' ``measure`` (another's where it has no rows)."""
        fits = {
            g.name: GroupFit.of(g, members, measure)
            for g in GROUPS
            if (members := [r for r in rows if group_of(r.shape) == g.name])
        }
        prefill = fits.get("prefill") or fits.get("verify") or fits["decode"]
        decode = fits.get("decode") or prefill
        return Fits(decode, fits.get("verify") or fits.get("prefill") or decode, prefill)

    def errors_on(self, rows: list[ProfileRow], device: bool = False) -> dict[str, float | int]:
        """Relative errors of this model's wall (device) times for ``rows``, their
        medians as truth."""
        time = self.device_time if device else self.step_time
        predicted = np.array([time(r.shape) for r in rows], dtype=np.float64)
        truth = [r.device_time if device else r.duration_s for r in rows]
        return relative_errors(predicted, np.array(truth))

    def error_text(self) -> str:
        parts = []
        for split, e in self.errors.items():
            if e["rows"]:
                parts.append(
                    f"{split} error over {e['rows']} rows: mean {e['mean']:.1%}, "
                    f"P90 {e['p90']:.1%}, max {e['max']:.1%}"
                )
            else:
                parts.append(f"no {split} rows")
        return "; ".join(parts)

    def measured_reach(self) -> Reach:
        return self.reach

    def step_time(self, shape: StepShape) -> float:
        return self._time(shape, self.wall)

    def device_time(self, shape: StepShape) -> float:
        return self._time(shape, self.device)

    def launch_time(self, shape: StepShape) -> float | None:
        return None if self.launches is None else self._time(shape, self.launches)

    @staticmethod
    def _time(shape: StepShape, fits: Fits) -> float:
        if shape.prefill_tokens + shape.decode_requests == 0:
            return 0.0
        return fits.of(shape).time(shape)

    def decode_times(self, batch: int, context_tokens: int, longest: int, k: int) -> np.ndarray:
        return self._decode_times(self.wall.decode, batch, context_tokens, longest, k)

    def decode_device_times(
        self, batch: int, context_tokens: int, longest: int, k: int
    ) -> np.ndarray:
        return self._decode_times(self.device.decode, batch, context_tokens, longest, k)

    def decode_launch_times(
        self, batch: int, context_tokens: int, longest: int, k: int
    ) -> np.ndarray | None:
        if self.launches is None:
            return None
        return self._decode_times(self.launches.decode, batch, context_tokens, longest, k)

    @staticmethod
    def _decode_times(
        d: GroupFit, batch: int, context_tokens: int, longest: int, k: int
    ) -> np.ndarray:
        growth = np.arange(0, batch * k, batch, dtype=np.float64)  # batch * i, exact
        return d.run_times(StepShape.decode(batch, context_tokens, longest), growth)

    def describe(self) -> dict[str, object]:
        out = super().describe()
        fits: dict[str, Any] = {}
        for measure, prefix in (("wall", ""), ("device", "device_"), ("launches", "launch_")):
            groups: Fits | None = getattr(self, measure)
            for name, fit in zip(Fits._fields, groups or (), strict=False):
                fits[prefix + name] = fit.describe()
        out["fit"] = {
            **fits,
            "errors": self.errors,
        }
        return out
