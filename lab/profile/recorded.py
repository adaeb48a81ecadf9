"""``engine profile --plans-from RECORD``: the plans of a run's step record, timed alone.

A step record (``schema.steprecord``) holds each step's shape and the device
time serving gave it. Timing plans of the same shapes on an idle runner splits
the step-time model's error on that run in two: the profile's fit (the cost
model against the plans timed alone) and serving itself (the plans timed alone
against the same plans in the run: the host, the other processes, the pool
around the step).

A shape does not name each request's context, so a plan is rebuilt from it:

- decode rows read ``decode_context`` positions in all, the longest
  ``decode_padded / decode_requests``; the rows ramp evenly up to the longest
  (serving's rows spread over many lengths), or where a ramp cannot reach that
  sum, one row at the longest and the others equal;
- ``prefill_requests`` chunks hold ``prefill_tokens`` after the cached prefix
  before them (``context_tokens`` less the decode rows' and the chunks' own
  tokens): one chunk takes the length and prefix that bring the query-key pairs
  nearest ``prefill_attention``, the others share the rest evenly.

So the rebuilt plan has the recorded plan's shape exactly in every field a
cost model reads, but ``prefill_attention`` where no such split reaches it (one
chunk is always exact; 48 of 50 mixed steps of an H200 edge run were) and
``sampled`` (every rebuilt chunk samples: a logits row more for a chunk that did
not end its prompt). ``shape_matches`` says which steps are exact but for that.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from core.scheduler.shape import StepShape
from lab.profile.grid import StepPoint
from schema.steprecord import SHAPE_COLUMNS
from sim.costs.profile import ProfileRow

if TYPE_CHECKING:
    import pandas as pd

KINDS = ("mixed", "decode", "prefill")


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One step of a record: its number, shape, prefill chunks, and its device time and host
    launch in the run."""

    step: int
    replica: int
    shape: StepShape
    prefill_requests: int
    device_ms: float
    launch_ms: float  # the host's launch in the run (launched - enqueued); NaN if unrecorded

    @property
    def kind(self) -> str:
        return ProfileRow.step_kind(self.shape)

    def point(self) -> StepPoint:
        """A plan of this step's shape (see the module doc)."""
        s = self.shape
        chunks: tuple[tuple[int, int], ...] = ()
        if s.prefill_tokens:
            k = max(1, min(self.prefill_requests, s.prefill_tokens))
            cached = max(0, s.context_tokens - s.decode_context - s.prefill_tokens)
            chunks = prefill_chunks(s.prefill_tokens, cached, k, s.prefill_attention)
        reads = decode_reads(s.decode_requests, s.decode_context, s.decode_padded)
        return StepPoint(chunks, tuple(r - 1 for r in reads), "fit")

    def shape_matches(self, page_size: int) -> bool:
        """Whether the rebuilt plan's shape is the recorded one in every field but
        ``sampled`` (one logits row more or less: a few microseconds)."""
        rebuilt = StepShape.of_plan(self.point().plan(page_size))
        return replace(rebuilt, sampled=self.shape.sampled) == self.shape


def spread(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` integers that differ by one at most."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def chunk_attention(chunks: Sequence[tuple[int, int]]) -> int:
    """Query-key pairs of prefill chunks ``(start, length)`` (``StepShape.prefill_attention``)."""
    return sum(n * s + n * (n + 1) // 2 for s, n in chunks)


def prefill_chunks(tokens: int, cached: int, k: int, attention: int) -> tuple[tuple[int, int], ...]:
    """``k`` chunks ``(start, length)`` of ``tokens`` in all after ``cached`` in all, whose
    query-key pairs come nearest ``attention``: the first chunk of each length
    ``1..tokens - k + 1`` with the prefix that brings it nearest, the rest spread evenly."""

    def chunks(first: int, start: int) -> tuple[tuple[int, int], ...]:
        rest = spread(tokens - first, k - 1) if k > 1 else []
        starts = spread(cached - start, k - 1) if k > 1 else []
        return ((start, first), *zip(starts, rest, strict=True))

    if k == 1:
        return ((cached, tokens),)
    best = chunks(tokens // k + (tokens % k > 0), cached // k + (cached % k > 0))
    for first in range(1, tokens - k + 2):
        other = (tokens - first) / (k - 1)  # the others' mean length
        base = chunk_attention(chunks(first, 0))
        slope = first - other  # pairs gained a prefix token moved onto the first chunk
        start = cached if slope == 0 else round((attention - base) / slope)
        candidate = chunks(first, min(cached, max(0, start)))
        if abs(chunk_attention(candidate) - attention) < abs(chunk_attention(best) - attention):
            best = candidate
    return best


def decode_reads(n: int, total: int, padded: int) -> list[int]:
    """``n`` KV reads (``position + 1``) summing to ``total``, the longest ``padded / n``:
    an even ramp from the shortest up to the longest, or one at the longest and the
    others equal where no ramp of reads >= 1 sums to ``total``."""
    if n == 0:
        return []
    longest = padded // n
    if n == 1:
        return [longest]
    lowest = 2 * total / n - longest  # a ramp's mean is the mean of its ends
    if lowest >= 1:
        reads = [round(lowest + (longest - lowest) * i / (n - 1)) for i in range(n)]
    else:
        reads = [longest, *spread(total - longest, n - 1)]
    reads[-1 if lowest >= 1 else 0] = longest
    fix = total - sum(reads)  # rounding: move the rest over the rows below the longest
    i = 0
    while fix and i < 4 * n:
        j = i % (n - 1) if lowest >= 1 else 1 + i % (n - 1)
        step = 1 if fix > 0 else -1
        if 1 <= reads[j] + step <= longest:
            reads[j] += step
            fix -= step
        i += 1
    return reads


def recorded_steps(frame: pd.DataFrame, per_kind: int) -> list[RecordedStep]:
    """Up to ``per_kind`` steps of each kind, evenly spaced over the record, with a device
    time; ``ValueError`` when the record has no device times (a CPU run's)."""
    timed = frame[frame["device_ms"].notna() & (frame["device_ms"] > 0)]
    if timed.empty:
        raise ValueError("the step record has no device times (a CUDA run records them)")
    steps = [
        RecordedStep(
            int(row["step"]),
            int(row["replica"]) if "replica" in timed.columns else 0,
            StepShape(*(int(row[c]) for c in SHAPE_COLUMNS)),
            int(row["prefill_requests"]),
            float(row["device_ms"]),
            1e3 * float(row["launched"] - row["enqueued"]),
        )
        for _, row in timed.iterrows()
    ]
    chosen: list[RecordedStep] = []
    for kind in KINDS:
        of_kind = [s for s in steps if s.kind == kind]
        chosen += evenly(of_kind, per_kind)
    return chosen


def evenly(items: Sequence[RecordedStep], count: int) -> list[RecordedStep]:
    """``count`` of ``items`` evenly spaced (all of them when there are no more)."""
    if len(items) <= count:
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]


COMPARISON_COLUMNS = (
    "replica", "step", "kind", "prefill_requests", *SHAPE_COLUMNS, "shape_exact",
    "recorded_device_ms", "alone_device_ms", "recorded_launch_ms", "alone_launch_ms",
)  # fmt: skip


def comparison_rows(
    steps: Sequence[RecordedStep],
    rows: Sequence[ProfileRow],
    launches: Sequence[float | None],
    page_size: int,
) -> list[list[str]]:
    """One row a step timed: its shape, the device and launch times the run gave it and the
    plan's alone (``launches``: seconds, per row)."""
    return [
        [
            str(s.replica),
            str(s.step),
            s.kind,
            str(s.prefill_requests),
            *(str(getattr(s.shape, c)) for c in SHAPE_COLUMNS),
            str(int(s.shape_matches(page_size))),
            f"{s.device_ms:.4f}",
            f"{r.device_time * 1e3:.4f}",
            f"{s.launch_ms:.4f}",
            "" if launch is None else f"{launch * 1e3:.4f}",
        ]
        for s, r, launch in zip(steps, rows, launches, strict=False)
    ]


def summary(
    steps: Sequence[RecordedStep], rows: Sequence[ProfileRow], launches: Sequence[float | None]
) -> list[str]:
    """Per kind: the run's summed device time over the summed time alone, the median of the
    step by step ratios, and the median host launch in the run and alone."""
    lines = ["recorded steps: device time in the run against the same plans alone"]
    for kind in KINDS:
        of_kind = [(s, r, x) for s, r, x in zip(steps, rows, launches, strict=False)
                   if s.kind == kind]  # fmt: skip
        if not of_kind:
            continue
        ran = sum(s.device_ms / 1e3 for s, _, _ in of_kind)
        alone = sum(r.device_time for _, r, _ in of_kind)
        ratios = [s.device_ms / 1e3 / r.device_time for s, r, _ in of_kind]
        launch_run = [s.launch_ms for s, _, _ in of_kind if not math.isnan(s.launch_ms)]
        launch_alone = [x * 1e3 for _, _, x in of_kind if x is not None]
        lines.append(
            f"  {kind:<8}{len(of_kind):5} steps  run/alone {ran / alone:6.3f} (summed), "
            f"median {median(ratios):6.3f}; launch median {median(launch_run):7.2f} ms in "
            f"the run, {median(launch_alone):7.2f} ms alone"
        )
    return lines


def median(values: Sequence[float]) -> float:
    """The median (NaN for none)."""
    return statistics.median(values) if values else math.nan
