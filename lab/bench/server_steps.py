"""The engine's own record of the steps it ran during a benchmark (``--server-steps PATH``).

``engine serve --record-steps PATH`` writes every step scheduler rank 0 runs to
PATH (``schema.steprecord``), times in epoch seconds. After the run the bench
reads that file, keeps the steps scheduled during the run (from the run's
clock zero to its end; the warm-up's steps come before it) and moves their
times onto the run's clock (minus ``epoch0``, as the server stamps in
``requests.csv``). The engine writes its rows when it falls idle, which it
does right after the run's last token; the bench waits up to ``WAIT_S`` for the
file to reach the last token the server stamped (known with ``meta_info``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lab.bench.client import RequestRecord
from schema.steprecord import TIME_COLUMNS, read_step_record

if TYPE_CHECKING:
    import pandas as pd

WAIT_S = 10.0
POLL_S = 0.05


def last_server_token(records: list[RequestRecord]) -> float | None:
    """The latest token time the server stamped (epoch seconds), None without ``meta_info``."""
    times = [float(r.meta["token_times"][-1]) for r in records if r.meta.get("token_times")]
    return max(times, default=None)


def _reaches(steps: pd.DataFrame, last: float | None) -> bool:
    return last is None or (not steps.empty and float(steps["done"].max()) >= last)


def run_steps(
    path: Path, records: list[RequestRecord], epoch0: float, wall_s: float, wait_s: float = WAIT_S
) -> pd.DataFrame:
    """The steps of ``path`` scheduled in ``[epoch0, epoch0 + wall_s]``, times minus ``epoch0``.

    ``ValueError`` when ``path`` is not a step record; a warning on stderr when it
    still ends before the run's last server token after ``wait_s`` seconds.
    """
    last = last_server_token(records)
    deadline = time.monotonic() + wait_s
    steps = read_step_record(path)
    while not _reaches(steps, last) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        steps = read_step_record(path)
    if not _reaches(steps, last):
        print(
            f"engine bench: warning: {path} ends before the run's last token after {wait_s:g} s; "
            "is the server recording its steps there?",
            file=sys.stderr,
        )
    start = steps["schedule_start"]
    steps = steps[(start >= epoch0) & (start <= epoch0 + wall_s)].reset_index(drop=True)
    for column in TIME_COLUMNS:
        steps[column] -= epoch0
    return steps
