"""``requests.csv`` rows from the per-request records, a range of the trace at a time.

A replay hands on each range of requests whose records became final
(``sim.model.replica.Streams.requests``): their rows go to the request table's
writer, and the columns the summary reads stay in memory (``SummaryColumns``,
some 60 bytes a request).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from schema.metrics import REQUEST_COLUMNS, SERVER_TOKEN_COLUMNS, TIME_COLUMNS
from schema.tables import TableWriter
from sim.model.replica import RequestRecords

SUMMARY_COLUMNS = ("status", "reason", "arrival", "finished", "input_tokens", "output_tokens",
                   "ttft_ms", "tpot_ms", "e2e_ms", "replica")  # fmt: skip
"""The request columns that ``schema.metrics.summarize`` and the replicas' summaries read."""


def _floats(column: Any, a: int, b: int) -> np.ndarray:
    """Rows ``[a, b)`` of a float column (a numpy array or an ``array('d')``), no copy."""
    whole = np.frombuffer(column, dtype=np.float64) if isinstance(column, array) else column
    part: np.ndarray = whole[a:b]
    return part


def request_rows(
    p: RequestRecords, replica_of: Sequence[int] | np.ndarray, a: int, b: int
) -> pd.DataFrame:
    """``requests.csv``'s rows of requests ``[a, b)``, and the replica that served each."""
    t = {k: _floats(v, a, b) for k, v in p.times.items()}
    out_tokens = p.totals.output_tokens[a:b]
    status = p.status[a:b]
    completed = np.asarray([s == "completed" for s in status], dtype=bool)
    ttft = np.where(completed, (t["first_token"] - t["arrival"]) * 1e3, np.nan)
    e2e = np.where(completed, (t["finished"] - t["arrival"]) * 1e3, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(completed & (out_tokens > 1), (e2e - ttft) / (out_tokens - 1), np.nan)
    trace = p.trace[a:b]
    return pd.DataFrame(
        {
            "rid": [r.rid for r in trace],
            "status": status,
            "reason": p.reason[a:b],
            **{k: t[k] for k in TIME_COLUMNS},
            "input_tokens": np.asarray([r.input_length for r in trace], dtype=np.int64),
            "output_tokens": out_tokens,
            "cached_tokens": np.asarray(p.cached_tokens[a:b], dtype=np.int64),
            "num_preemptions": np.asarray(p.preemptions[a:b], dtype=np.int64),
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": e2e,
            "tokenizer_queue_ms": (t["tokenize_start"] - t["tokenizer_enter"]) * 1e3,
            "tokenize_ms": (t["tokenized"] - t["tokenize_start"]) * 1e3,
            "ipc_ms": (t["tokenizer_enter"] - t["parsed"] + t["sched_arrival"] - t["tokenized"])
            * 1e3,
            "scheduler_wait_ms": (t["first_scheduled"] - t["sched_arrival"]) * 1e3,
            "prefill_ms": (t["first_token"] - t["first_scheduled"]) * 1e3,
            "decode_ms": (t["finished"] - t["first_token"]) * 1e3,
            "detokenize_ms": p.totals.detokenize_s[a:b] * 1e3,
            "frontend_ms": (t["parsed"] - t["arrival"]) * 1e3,
            "replica": np.asarray(replica_of[a:b], dtype=np.int64),
            **{k: t[k] for k in SERVER_TOKEN_COLUMNS},
        },
        columns=[*REQUEST_COLUMNS, "replica", *SERVER_TOKEN_COLUMNS],
    )


class RequestTable:
    """Takes the final rows of a replay: writes them to ``writer`` and keeps the summary's
    columns (``SummaryColumns``) in memory."""

    def __init__(self, writer: TableWriter) -> None:
        self.writer = writer
        self.records: RequestRecords | None = None
        self.replica_of: Sequence[int] | np.ndarray = ()
        self._kept: list[pd.DataFrame] = []

    def attach(self, records: RequestRecords, replica_of: Sequence[int] | np.ndarray) -> None:
        """The records whose rows come, and the replica of each request."""
        self.records, self.replica_of = records, replica_of

    def take(self, a: int, b: int) -> None:
        """Requests ``[a, b)`` became final."""
        if self.records is None:
            raise RuntimeError("RequestTable.take() before attach()")
        rows = request_rows(self.records, self.replica_of, a, b)
        self.writer.write(rows)
        self._kept.append(rows[list(SUMMARY_COLUMNS)].copy())

    def close(self, num_requests: int) -> pd.DataFrame:
        """End the table (all ``num_requests`` must have come); the summary's columns."""
        if self.records is None or self.records.written != num_requests:
            raise RuntimeError("the replay ended with requests whose records are not final")
        self.writer.close()
        return pd.concat(self._kept, ignore_index=True)
