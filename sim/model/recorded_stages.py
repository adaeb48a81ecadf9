"""Recorded CPU stages: a run's own delays around the scheduler, in place of the modelled ones.

A replay given ``RecordedStages`` of a run (its ``requests.csv``, real or
simulated) keeps its scheduler, steps and cost model, and takes per request:

- intake (client send -> the request reaches the scheduler: frontend, tokenizer
  and the hops): the request reaches the scheduler at the run's
  ``sched_arrival`` where recorded (a simulated run), else at its
  ``tokenized`` stamp plus one modelled IPC hop (the engine stamps the end of
  tokenization; the hop to the scheduler has no stamp);
- output (server token time -> client): the run's ``first_token -
  server_first_token`` and ``finished - server_last_token``
  (``schema.metrics.SERVER_TOKEN_COLUMNS``), added to the replay's own server
  times of the request's first and last token, so TTFT, E2E and TPOT carry the
  recorded ways out (per request: the stamps give no more).

A request the run has no stamp for keeps the modelled stage. The replay's
arrivals should be the run's send times (``at_send_times``) so that the intake
starts where it started in the run.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from schema.metrics import SERVER_TOKEN_COLUMNS
from schema.traces import Trace
from schema.traces.record import TraceRequest


@dataclass(frozen=True, slots=True)
class RecordedStages:
    """Per request of a trace (its order): when it reached the scheduler or, failing that, was
    tokenized, and its ways out to the client of the first and the last token (NaN: not
    recorded, the model's)."""

    sched_arrival: np.ndarray
    tokenized: np.ndarray
    first_out: np.ndarray
    last_out: np.ndarray

    @staticmethod
    def of_run(run: pd.DataFrame, requests: list[TraceRequest]) -> RecordedStages:
        """The stages of ``run`` (a ``requests.csv``) for ``requests``, matched by rid."""
        missing = {"rid", "tokenized", "first_token", "finished"} - set(run.columns)
        if missing:
            raise ValueError(f"a run's requests table lacks {sorted(missing)}")
        by_rid = run.set_index(run["rid"].astype(str))
        rows = by_rid.reindex([r.rid for r in requests])

        def column(name: str) -> np.ndarray:
            if name not in rows.columns:
                return np.full(len(rows), math.nan)
            values: np.ndarray = rows[name].to_numpy(np.float64)
            return values

        first, last = (column(c) for c in SERVER_TOKEN_COLUMNS)
        return RecordedStages(
            column("sched_arrival"),
            column("tokenized"),
            column("first_token") - first,
            column("finished") - last,
        )

    def counts(self) -> dict[str, int]:
        """How many requests have a recorded intake and a recorded way out."""
        return {
            "requests": len(self.sched_arrival),
            "intake_recorded": int(
                (np.isfinite(self.sched_arrival) | np.isfinite(self.tokenized)).sum()
            ),
            "output_recorded": int(np.isfinite(self.first_out).sum()),
        }

    def intake(self, sched_arrival: array[float], ipc: float) -> array[float]:
        """The modelled times of reaching the scheduler, recorded ones in their place
        (``tokenized`` + ``ipc`` where only the end of tokenization is recorded)."""
        modelled = np.frombuffer(sched_arrival, dtype=np.float64)
        reached = np.where(np.isfinite(self.tokenized), self.tokenized + ipc, modelled)
        return array("d", np.where(np.isfinite(self.sched_arrival), self.sched_arrival, reached))

    def deliver(self, times: dict[str, Any], members: Iterable[int]) -> None:
        """Client times of ``members`` = their server token times plus the recorded ways out."""
        first_token, finished = times["first_token"], times["finished"]
        server_first, server_last = (times[c] for c in SERVER_TOKEN_COLUMNS)
        for i in members:
            out = self.first_out[i]
            if math.isfinite(out) and math.isfinite(server_first[i]):
                first_token[i] = server_first[i] + out
            out = self.last_out[i]
            if math.isfinite(out) and math.isfinite(server_last[i]):
                finished[i] = server_last[i] + out


def at_send_times(trace: Trace, run: pd.DataFrame) -> Trace:
    """``trace`` with each request arriving when ``run`` sent it (its ``arrival``), re-sorted;
    requests the run did not send keep their arrival."""
    sent = dict(zip(run["rid"].astype(str), run["arrival"].to_numpy(np.float64), strict=True))
    moved = [
        replace(r, arrival=float(sent[r.rid])) if math.isfinite(sent.get(r.rid, math.nan)) else r
        for r in trace.requests
    ]
    return replace(trace, requests=sorted(moved, key=lambda r: r.arrival))
