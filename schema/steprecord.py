"""The step record: every step a scheduler ran, as the engine (or the simulator) saw it.

One row per step of scheduler rank 0, in step order, written to
``engine_steps.csv`` beside a run's other tables. The engine writes it when
asked (``engine serve --record-steps``); the simulator writes the same table
for its own steps, so a simulated run can stand in for a real one.

Times are seconds on the run's clock (``engine bench`` and ``sim replay``
both count from the run's start):

- ``schedule_start`` / ``schedule_end``: the core's ``schedule`` call for this
  step (the waiting and running counts are read just before it);
- ``launched``: the step's inputs built and handed to the model;
- ``done``: its tokens read back and the core's ``complete`` returned;
- ``device_ms``: the model's device time for the step where the device can
  time it (CUDA events), else empty;
- ``in_flight``: 1 when the step was launched before the step ahead of it
  was finished (overlap scheduling: that step's tokens were not yet read back,
  so the device may still have been running it), else 0.

The plan's composition is its ``core.scheduler.StepShape`` (the numbers a
cost model prices), plus ``prefill_requests``, the number of prefill chunks.
Steps whose plan ran nothing on the model (only releases, or nothing could be
admitted) have no row, so ``step`` (the core's step number) may skip.

The engine writes the times as epoch seconds (``time.time()``, the clock of
the ``meta_info`` stamps); ``engine bench --server-steps`` keeps the steps
scheduled during its run and moves them onto the run's clock.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

SHAPE_COLUMNS = (
    "prefill_tokens",
    "decode_requests",
    "context_tokens",
    "decode_context",
    "decode_padded",
    "prefill_attention",
    "sampled",
)
"""The plan's shape: the fields of ``core.scheduler.StepShape``, in its order (a test keeps
the two equal; the schema imports nothing of the core)."""

STEP_RECORD_COLUMNS = (
    "step",
    "schedule_start",
    "schedule_end",
    "launched",
    "done",
    "device_ms",
    "in_flight",
    "num_waiting",
    "num_running",
    "prefill_requests",
    *SHAPE_COLUMNS,
)
STEP_RECORD_NAME = "engine_steps.csv"


TIME_COLUMNS = ("schedule_start", "schedule_end", "launched", "done")
"""The columns that are times (seconds; see the module doc for their clock)."""
FLOAT_COLUMNS = (*TIME_COLUMNS, "device_ms")
"""Columns read as float64 (``device_ms`` is NaN where the device did not time the step); the
others are int64."""


def read_step_record(path: Path) -> pd.DataFrame:
    """A step record as a frame with ``STEP_RECORD_COLUMNS`` in order, typed as ``FLOAT_COLUMNS``
    says, its steps in step order; ``ValueError`` naming ``path`` when its header or a cell
    does not fit or a step lacks one of its times."""
    import pandas as pd

    with path.open(newline="") as f:
        header = next(csv.reader(f), [])
    if tuple(header) != STEP_RECORD_COLUMNS:
        raise ValueError(
            f"{path} is not a step record: its columns are {header}, "
            f"expected {list(STEP_RECORD_COLUMNS)}"
        )
    dtypes = {c: "float64" if c in FLOAT_COLUMNS else "int64" for c in STEP_RECORD_COLUMNS}
    try:
        frame = pd.read_csv(path, dtype=dtypes)
    except ValueError as exc:
        raise ValueError(f"{path}: a cell is not a number of its column's type: {exc}") from None
    if frame[list(TIME_COLUMNS)].isna().to_numpy().any():
        raise ValueError(f"{path}: a step lacks one of its times")
    return frame.sort_values("step", kind="stable").reset_index(drop=True)
