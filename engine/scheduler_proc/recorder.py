"""The step record of scheduler rank 0 (``engine serve --record-steps PATH``; with
``--dp N``, each replica's rank 0 to its own file, ``schema.steprecord.replica_record_path``).

One row per step that ran a plan on the model, in ``schema.steprecord``'s
columns, times in epoch seconds. A step costs the recorder a few clock reads,
the plan's ``StepShape`` (computed while the device runs the step) and one
tuple appended to a list; the rows reach the file as CSV in batches: every
``FLUSH_EVERY`` steps, whenever the scheduler falls idle (so a benchmark that
waits for its last token finds every step of its run in the file), and at
exit. A flush holds SIGTERM back until its rows are written whole.

A speculating engine (``--speculative``) adds ``SPECULATIVE_COLUMNS`` at the
end of each row: the draft tokens the step fed for verification and those the
model accepted. A prefill or decode server adds ``TRANSFER_COLUMNS`` after them:
the KV transfers that ended well since the row before, from its hand-offs'
running counters (``TransferCounters``, read as each row is added).
"""

from __future__ import annotations

import csv
import signal
from pathlib import Path
from typing import NamedTuple

from core.scheduler import Plan, StepShape
from engine.scheduler_proc.pd import TransferCounters
from schema.steprecord import SPECULATIVE_COLUMNS, STEP_RECORD_COLUMNS, TRANSFER_COLUMNS

FLUSH_EVERY = 256  # rows kept between writes while busy (a write stalls the loop: keep it short)


class Launch(NamedTuple):
    """What a step's row knows once the step is on the device: all but ``done`` and
    ``device_ms`` (see ``schema.steprecord``)."""

    step: int
    schedule_start: float
    schedule_end: float
    enqueued: float
    launched: float
    in_flight: bool
    num_waiting: int
    num_running: int
    prefill_requests: int
    shape: StepShape
    draft_tokens: int

    @staticmethod
    def of(
        plan: Plan,
        times: tuple[float, float, float, float],
        in_flight: bool,
        counts: tuple[int, int],
    ) -> Launch:
        """``times``: the ``schedule`` call's start and end, the start of handing the step's
        work to the device, and the launch; ``counts``: the waiting and running requests
        before ``schedule``."""
        return Launch(
            plan.step,
            *times,
            in_flight,
            *counts,
            len(plan.prefill),
            StepShape.of_plan(plan),
            plan.num_draft_tokens,
        )


Row = tuple[int | float | None, ...]


class StepRecorder:
    """Appends step rows to a CSV file with a header row (the file is replaced); with
    ``speculative``, the draft columns too; with ``transfers`` (a prefill or decode server),
    the transfer columns, from the hand-offs' ``transfer_counters`` (none until they are
    set: the hand-offs come to be after the recorder)."""

    def __init__(
        self,
        path: Path,
        flush_every: int = FLUSH_EVERY,
        speculative: bool = False,
        transfers: bool = False,
    ) -> None:
        self.flush_every = flush_every
        self.speculative = speculative
        self.transfers = transfers
        self.transfer_counters: TransferCounters | None = None
        self._counted = (0, 0, 0.0)  # ok transfers, bytes, seconds at the row before
        self.rows: list[Row] = []
        self.file = path.open("w", newline="")
        self.writer = csv.writer(self.file)
        extra = (*(SPECULATIVE_COLUMNS if speculative else ()),
                 *(TRANSFER_COLUMNS if transfers else ()))  # fmt: skip
        self.writer.writerow((*STEP_RECORD_COLUMNS, *extra))
        self.file.flush()

    def add(
        self, launch: Launch, done: float, device_ms: float | None, accepted_tokens: int = 0
    ) -> None:
        """A step's row; ``accepted_tokens``: the draft tokens its verification kept."""
        s = launch.shape
        row: Row = (
            launch.step, launch.schedule_start, launch.schedule_end, launch.enqueued,
            launch.launched, done, device_ms, int(launch.in_flight), launch.num_waiting,
            launch.num_running,
            launch.prefill_requests, s.prefill_tokens, s.decode_requests, s.context_tokens,
            s.decode_context, s.decode_padded, s.prefill_attention, s.sampled,
        )  # fmt: skip
        if self.speculative:
            row += (launch.draft_tokens, accepted_tokens)
        if self.transfers:
            row += self._transferred()
        self.rows.append(row)
        if len(self.rows) >= self.flush_every:
            self.flush()

    def _transferred(self) -> tuple[int, int, float]:
        """The transfers that ended well since the row before: count, bytes, milliseconds."""
        t = self.transfer_counters
        if t is None:
            return 0, 0, 0.0
        now = (t.ended["ok"], t.nbytes, t.seconds)
        (n0, b0, s0), self._counted = self._counted, now
        return now[0] - n0, now[1] - b0, (now[2] - s0) * 1e3

    def flush(self) -> None:
        """Write the rows kept so far (SIGTERM waits until they are written)."""
        if not self.rows:
            return
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            self.writer.writerows(self.rows)
            self.file.flush()
            self.rows.clear()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def close(self) -> None:
        self.flush()
        self.file.close()
