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
- ``in_flight``: 1 when another step was still running on the device at
  ``launched`` (overlap scheduling), else 0.

The plan's composition is its ``core.scheduler.StepShape`` (the numbers a
cost model prices), plus ``prefill_requests``, the number of prefill chunks.
"""

from __future__ import annotations

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
