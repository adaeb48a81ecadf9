"""The simulator's step record: ``engine_steps.csv`` (``schema.steprecord``) for simulated steps.

The scheduler loop adds one row per step that ran a plan with model work, with
the simulated clock's times (seconds from the run's start):

- strict loop: ``schedule_start`` = the step's start, ``schedule_end`` =
  ``launched`` = start + the scheduler's CPU time, ``done`` = the step's end
  (its tokens leave then); ``in_flight`` is 0 and ``device_ms`` empty (the
  strict loop prices a step's wall time only, as the engine records no device
  time where it cannot time the device);
- overlapped loop: ``schedule_start`` = the iteration's start, ``schedule_end``
  = it + the scheduler's CPU time, ``launched`` = when the CPU launched the
  plan (scheduler time plus the step's host work), ``done`` = the end of its
  GPU work; ``in_flight`` = 1 when the previous step's GPU work had not ended
  at ``launched``; ``device_ms`` the cost model's device time of the step.

``num_waiting`` and ``num_running`` are the core's counts just before ``schedule``. A fast-forwarded
decode run is expanded with numpy as it is added (its shapes grow by one token
a request per step), so the record costs a few array appends per step; it is
kept only when asked for (``LoopSettings.record_steps``). A speculating replay
adds ``SPECULATIVE_COLUMNS`` as the speculating engine does: the draft tokens a
step fed and those its draws accepted. A disaggregated replay's replicas add
``TRANSFER_COLUMNS`` as a prefill or decode server does: the transfers that ended since
the row before (``note_transfer``), on a prefill replica when it took the acknowledgment in
(its time from the send, both loops' waits included, as the engine's prefill server counts
it), on a decode replica when it took the landed KV in (its time the transfer's price, from
the send to the landing, where the engine's decode server counts only writing the pages).
"""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from core.scheduler.plan import Plan
from core.scheduler.shape import StepShape
from schema.steprecord import (
    SHAPE_COLUMNS,
    SPECULATIVE_COLUMNS,
    STEP_RECORD_COLUMNS,
    TRANSFER_COLUMNS,
)

TIME_COLUMNS = ("schedule_start", "schedule_end", "launched", "done", "device_ms")
INT_COLUMNS = tuple(c for c in STEP_RECORD_COLUMNS if c not in (*TIME_COLUMNS, "enqueued"))


class StepRecordLog:
    """Rows of ``engine_steps.csv`` in step order, column by column (``speculative``: with the
    draft columns; ``transfers``: with the KV transfer columns)."""

    def __init__(self, speculative: bool = False, transfers: bool = False) -> None:
        self._floats = {c: array("d") for c in TIME_COLUMNS}
        extra = (*(SPECULATIVE_COLUMNS if speculative else ()),
                 *(TRANSFER_COLUMNS if transfers else ()))  # fmt: skip
        self._ints = {c: array("q") for c in (*INT_COLUMNS, *extra) if c != "kv_transfer_ms"}
        if transfers:
            self._floats["kv_transfer_ms"] = array("d")
        self.columns = [*STEP_RECORD_COLUMNS, *extra]
        self._ended = (0, 0, 0.0)  # transfers ended since the last row: count, bytes, seconds

    def note_transfer(self, nbytes: int, seconds: float) -> None:
        """A transfer of ``nbytes`` ended well now, after ``seconds``: the next row counts it."""
        count, total, time = self._ended
        self._ended = (count + 1, total + nbytes, time + seconds)

    def _transfers(self, rows: int) -> None:
        """The transfer columns of ``rows`` new rows: the first takes what ended since the
        last row."""
        if "kv_transfers" not in self._ints:
            return
        (count, nbytes, seconds), self._ended = self._ended, (0, 0, 0.0)
        pad = rows - 1
        self._ints["kv_transfers"].extend([count] + [0] * pad)
        self._ints["kv_bytes"].extend([nbytes] + [0] * pad)
        self._floats["kv_transfer_ms"].extend([seconds * 1e3] + [0.0] * pad)

    def add(
        self,
        step: int,
        times: tuple[float, float, float, float],
        device_s: float,
        in_flight: bool,
        waiting_running: tuple[int, int],
        prefill_requests: int,
        shape: StepShape,
        drafts: tuple[int, int] = (0, 0),
    ) -> None:
        """One step: ``times`` = (schedule_start, schedule_end, launched, done); ``drafts``: its
        draft tokens and those accepted (kept when speculative)."""
        f, i = self._floats, self._ints
        for name, t in zip(TIME_COLUMNS, times, strict=False):
            f[name].append(t)
        f["device_ms"].append(device_s * 1e3)
        i["step"].append(step)
        i["in_flight"].append(int(in_flight))
        i["num_waiting"].append(waiting_running[0])
        i["num_running"].append(waiting_running[1])
        i["prefill_requests"].append(prefill_requests)
        for name in SHAPE_COLUMNS:
            i[name].append(getattr(shape, name))
        if "draft_tokens" in i:
            i["draft_tokens"].append(drafts[0])
            i["accepted_tokens"].append(drafts[1])
        self._transfers(1)

    def add_run(
        self,
        first_step: int,
        times: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        device_s: np.ndarray,
        prev_end: float | None,
        waiting_running: tuple[int, int],
        decode: tuple[int, int, int],
    ) -> None:
        """A run of pure-decode steps; ``decode`` = (batch, context, longest) of its first
        step, both growing each step (``StepShape.decode``). With overlap (``prev_end``: when
        the GPU work of the step before the run ends) a step is launched in flight when the
        previous step's GPU work had not ended."""
        k = len(device_s)
        if prev_end is None:
            in_flight = np.zeros(k, dtype=bool)
        else:
            launched, done = times[2], times[3]
            in_flight = launched < np.concatenate(([prev_end], done[:-1]))
        f, i = self._floats, self._ints
        for name, t in zip(TIME_COLUMNS, times, strict=False):
            f[name].frombytes(np.asarray(t, dtype=np.float64).tobytes())
        f["device_ms"].frombytes((np.asarray(device_s, dtype=np.float64) * 1e3).tobytes())
        batch, context, longest = decode
        growth = np.arange(k, dtype=np.int64)
        columns = {
            "step": first_step + growth,
            "in_flight": np.asarray(in_flight, dtype=np.int64),
            "num_waiting": np.full(k, waiting_running[0], dtype=np.int64),
            "num_running": np.full(k, waiting_running[1], dtype=np.int64),
            "prefill_requests": np.zeros(k, dtype=np.int64),
            "prefill_tokens": np.zeros(k, dtype=np.int64),
            "decode_requests": np.full(k, batch, dtype=np.int64),
            "context_tokens": context + batch * growth,
            "decode_context": context + batch * growth,
            "decode_padded": batch * (longest + growth),
            "prefill_attention": np.zeros(k, dtype=np.int64),
            "sampled": np.full(k, batch, dtype=np.int64),
        }
        for name, values in columns.items():
            i[name].frombytes(values.tobytes())
        drafts = set(i) - columns.keys() - set(TRANSFER_COLUMNS)
        for name in drafts:  # a run verifies no draft
            i[name].frombytes(np.zeros(k, dtype=np.int64).tobytes())
        self._transfers(k)

    def frame(self) -> pd.DataFrame:
        """All rows, columns in ``STEP_RECORD_COLUMNS`` order (then the draft or transfer
        columns). A simulated step's host work all comes before its device work, so it is
        handed to the device when launched (``enqueued`` = ``launched``)."""
        data = {c: np.frombuffer(a, dtype=np.float64) for c, a in self._floats.items()}
        data["enqueued"] = data["launched"]
        data |= {c: np.frombuffer(a, dtype=np.int64) for c, a in self._ints.items()}
        return pd.DataFrame(data, columns=self.columns)


def drafts_of(plan: Plan, accepted: dict[str, int] | None) -> tuple[int, int]:
    """A step's draft tokens and those accepted (the speculating engine's record columns)."""
    return plan.num_draft_tokens, sum(accepted.values()) if accepted else 0
