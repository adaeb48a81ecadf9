"""The step record: every step a scheduler ran, as the engine (or the simulator) saw it.

One row per step of scheduler rank 0, in step order, written to
``engine_steps.csv`` beside a run's other tables. The engine writes it when
asked (``engine serve --record-steps``); the simulator writes the same table
for its own steps, so a simulated run can stand in for a real one.

Times are seconds on the run's clock (``engine bench`` and ``sim replay``
both count from the run's start):

- ``schedule_start`` / ``schedule_end``: the core's ``schedule`` call for this
  step (the waiting and running counts are read just before it);
- ``enqueued``: the host starts handing the step's work to the device (its inputs
  and the request table built; on CUDA where the timing event that opens
  ``device_ms`` is recorded): the host work in front of the step ends here;
- ``launched``: the step's forward handed to the model (an eager forward has
  launched all its kernels by then, while the device ran the first ones);
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

A speculating engine (``engine serve --speculative``) writes two more columns
after those, ``SPECULATIVE_COLUMNS``: ``draft_tokens``, the draft tokens the
step fed for verification, and ``accepted_tokens``, those the model accepted.

A prefill or decode server (``engine serve --role prefill|decode``) writes three more
columns after those, ``TRANSFER_COLUMNS``: the KV transfers that ended well between the step
before and this one's end (sent, on a prefill server; landed, on a decode server),
``kv_transfers``, their bytes, ``kv_bytes``, and their summed time, ``kv_transfer_ms``, as
the server's ``engine_kv_transfer_seconds_total`` counts it (prefill: from the send to the
acknowledgment; decode: writing the pages). A disaggregated replay writes them too
(``sim.model.step_record``).

With several replicas (``engine serve --dp N``, ``sim replay --replicas N``)
each replica's scheduler has its own steps: the engine writes replica k's to
``replica_record_path(PATH, k, N)``, and a run's table holds them all with a
last column, ``replica``, in (replica, step) order.
"""

from __future__ import annotations

import csv
import gzip
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
    "enqueued",
    "launched",
    "done",
    "device_ms",
    "in_flight",
    "num_waiting",
    "num_running",
    "prefill_requests",
    *SHAPE_COLUMNS,
)
SPECULATIVE_COLUMNS = ("draft_tokens", "accepted_tokens")
"""The columns a speculating engine adds after ``STEP_RECORD_COLUMNS``."""
TRANSFER_COLUMNS = ("kv_transfers", "kv_bytes", "kv_transfer_ms")
"""The columns a prefill or decode server adds after those (and the speculative ones)."""
STEP_RECORD_NAME = "engine_steps.csv"
REPLICA_COLUMN = "replica"
"""The last column of a record of several replicas: the replica that ran the step."""


TIME_COLUMNS = ("schedule_start", "schedule_end", "enqueued", "launched", "done")
"""The columns that are times (seconds; see the module doc for their clock)."""
LEGACY_COLUMNS = tuple(c for c in STEP_RECORD_COLUMNS if c != "enqueued")
"""The columns of records written before ``enqueued`` was: read with ``enqueued`` empty."""
FLOAT_COLUMNS = (*TIME_COLUMNS, "device_ms", "kv_transfer_ms")
"""Columns read as float64 (``device_ms`` is NaN where the device did not time the step); the
others are int64."""


def replica_record_path(path: Path, replica: int, replicas: int) -> Path:
    """The file replica ``replica`` of ``replicas`` writes for ``--record-steps path``:
    ``path`` itself for one replica, else ``STEM.replicaK.SUFFIX`` beside it."""
    if replicas == 1:
        return path
    return path.with_name(f"{path.stem}.replica{replica}{path.suffix}")


def step_record_in(folder: Path) -> Path | None:
    """The step record a run's folder holds: ``STEP_RECORD_NAME``, or the same gzipped
    (``.gz`` beside it: a kept report's), or None."""
    for path in (folder / STEP_RECORD_NAME, folder / f"{STEP_RECORD_NAME}.gz"):
        if path.is_file():
            return path
    return None


def read_step_record(path: Path) -> pd.DataFrame:
    """A step record as a frame with ``STEP_RECORD_COLUMNS`` in order (then
    ``SPECULATIVE_COLUMNS``, ``TRANSFER_COLUMNS`` and ``replica`` where the file has them), typed as
    ``FLOAT_COLUMNS`` says, in step order (replica by replica; a ``.gz`` file is read
    gzipped); ``ValueError`` naming ``path`` when its header or a cell does not fit or a
    step lacks one of its times."""
    import pandas as pd

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        header = tuple(next(csv.reader(f), []))
    known = [
        (*columns, *transfers, *last)
        for columns in (
            STEP_RECORD_COLUMNS,
            LEGACY_COLUMNS,
            (*STEP_RECORD_COLUMNS, *SPECULATIVE_COLUMNS),
        )
        for transfers in ((), TRANSFER_COLUMNS)
        for last in ((), (REPLICA_COLUMN,))
    ]
    if header not in known:
        raise ValueError(
            f"{path} is not a step record: its columns are {list(header)}, "
            f"expected {list(STEP_RECORD_COLUMNS)} (and {REPLICA_COLUMN!r} with several replicas)"
        )
    dtypes = {c: "float64" if c in FLOAT_COLUMNS else "int64" for c in header}
    try:
        frame = pd.read_csv(path, dtype=dtypes)
    except ValueError as exc:
        raise ValueError(f"{path}: a cell is not a number of its column's type: {exc}") from None
    required = [c for c in TIME_COLUMNS if c != "enqueued"]
    if frame[required].isna().to_numpy().any():
        raise ValueError(f"{path}: a step lacks one of its times")
    if "enqueued" not in header:  # an older record: its steps' host work is read as before
        frame.insert(STEP_RECORD_COLUMNS.index("enqueued"), "enqueued", float("nan"))
    order = [REPLICA_COLUMN, "step"] if REPLICA_COLUMN in header else ["step"]
    return frame.sort_values(order, kind="stable").reset_index(drop=True)
