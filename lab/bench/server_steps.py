"""The engine's own record of the steps it ran during a benchmark (``--server-steps PATH``).

``engine serve --record-steps PATH`` writes every step scheduler rank 0 runs to
PATH (``schema.steprecord``), times in epoch seconds; with ``--dp N`` each
replica writes its own file (``replica_record_path``). After the run the bench
reads the files, keeps the steps scheduled during the run (from the run's
clock zero to its end; the warm-up's steps come before it) and moves their
times onto the run's clock (minus ``epoch0``, as the server stamps in
``requests.csv``); several replicas' steps go into one table with a
``replica`` column. The engine writes its rows when it falls idle, which it
does right after the run's last token; the bench waits up to ``WAIT_S`` for the
files to reach the last token the server stamped (known with ``meta_info``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lab.bench.client import RequestRecord
from schema.steprecord import REPLICA_COLUMN, TIME_COLUMNS, read_step_record

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


def _read(paths: list[Path]) -> pd.DataFrame:
    """The records of ``paths`` (one per replica, in replica order) as one table; a
    ``replica`` column where there are several."""
    import pandas as pd

    if len(paths) == 1:
        return read_step_record(paths[0])
    frames = [read_step_record(p).assign(**{REPLICA_COLUMN: k}) for k, p in enumerate(paths)]
    return pd.concat(frames, ignore_index=True)


def run_steps(
    paths: list[Path],
    records: list[RequestRecord],
    epoch0: float,
    wall_s: float,
    wait_s: float = WAIT_S,
) -> pd.DataFrame:
    """The steps of ``paths`` (the server's record, a file per replica) scheduled in
    ``[epoch0, epoch0 + wall_s]``, times minus ``epoch0``.

    ``ValueError`` when a file is not a step record; a warning on stderr when they
    still end before the run's last server token after ``wait_s`` seconds.
    """
    last = last_server_token(records)
    deadline = time.monotonic() + wait_s
    steps = _read(paths)
    while not _reaches(steps, last) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        steps = _read(paths)
    if not _reaches(steps, last):
        named = ", ".join(str(p) for p in paths)
        print(
            f"engine bench: warning: {named} end(s) before the run's last token after "
            f"{wait_s:g} s; is the server recording its steps there?",
            file=sys.stderr,
        )
    start = steps["schedule_start"]
    steps = steps[(start >= epoch0) & (start <= epoch0 + wall_s)].reset_index(drop=True)
    for column in TIME_COLUMNS:
        steps[column] -= epoch0
    return steps
