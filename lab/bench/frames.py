"""A benchmark's records as ``sim replay``'s outputs: requests, inter-token gaps, steps.

``requests.csv`` has the replay's columns (``schema.metrics.REQUEST_COLUMNS``):
``arrival`` is when the request was sent, ``first_token`` and ``finished``
when its first text chunk and the end of its stream reached the client, so
TTFT, TPOT and E2E are client-side. Server stages come from this engine's
``meta_info`` (empty for other servers): ``frontend_ms`` = received at the
server - sent; ``tokenize_ms`` = tokenized - received (the hop to a worker,
its queue and the tokenization); ``scheduler_wait_ms`` = first scheduled -
tokenized (the hop to the scheduler and the wait); ``prefill_ms`` = first
token at the client - first scheduled. Columns the server does not report
(``tokenize_start``, ``sched_arrival``, the queue and IPC splits,
``detokenize_ms``, ``num_preemptions``) are empty. ``send_lag_ms`` is how
late the request left against the trace's arrival; ``replica`` the replica this
engine's frontend placed it on (``engine serve --dp N``; 0 for one, empty for other
servers), as in ``sim replay``'s table; ``server_first_token`` and ``server_last_token``
(``schema.metrics.SERVER_TOKEN_COLUMNS``, the last two) are the server's times of the
first and the last token (``token_times``).

``steps.csv`` is rebuilt from the server's token times: one scheduler step
stamps all its tokens with one time, so equal times across requests are one
step (steps that only advance a chunked prefill produce no token and are
folded into the next). A step ends at its token time and starts when the
previous one ended, or when its requests were first scheduled if the engine
was idle. ``prefill_tokens`` counts the uncached prompt tokens of the requests
whose first token the step produced; ``num_running`` the requests scheduled
and unfinished when it started. The other step columns are empty.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from lab.bench.client import RequestRecord
from schema.metrics import REQUEST_COLUMNS, SERVER_TOKEN_COLUMNS
from schema.steplog import STEP_COLUMNS

NAN = float("nan")
BENCH_COLUMNS = ("send_lag_ms", "replica")
"""Columns of a benchmark's ``requests.csv`` between the replay's and the server's token times."""


def _server_time(meta: dict[str, Any], key: str, epoch0: float) -> float:
    value = meta.get(key)
    return float(value) - epoch0 if isinstance(value, int | float) else NAN


def _request_row(r: RequestRecord, epoch0: float) -> dict[str, Any]:
    done = r.status == "completed"
    first = r.chunk_times[0] if done else NAN
    finished = r.finished if done else NAN
    received = _server_time(r.meta, "received", epoch0)
    tokenized = _server_time(r.meta, "tokenized", epoch0)
    scheduled = _server_time(r.meta, "first_scheduled", epoch0)
    out_tokens = int(r.usage.get("completion_tokens", len(r.chunk_times)))
    ttft = (first - r.sent) * 1e3
    e2e = (finished - r.sent) * 1e3
    tpot = (e2e - ttft) / (out_tokens - 1) if done and out_tokens > 1 else NAN
    cached = (r.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    stamps = r.meta.get("token_times") or []
    server_first = float(stamps[0]) - epoch0 if stamps else NAN
    server_last = float(stamps[-1]) - epoch0 if stamps else NAN
    return {
        "rid": r.rid,
        "status": r.status,
        "reason": r.reason,
        "arrival": r.sent,
        "tokenize_start": NAN,
        "tokenized": tokenized,
        "sched_arrival": NAN,
        "first_scheduled": scheduled,
        "first_token": first,
        "finished": finished if done else r.finished,
        "input_tokens": int(r.usage.get("prompt_tokens", r.input_length)),
        "output_tokens": out_tokens if done else 0,
        "cached_tokens": int(cached or 0),
        "num_preemptions": NAN,
        "ttft_ms": ttft,
        "tpot_ms": tpot,
        "e2e_ms": e2e,
        "tokenizer_queue_ms": NAN,
        "tokenize_ms": (tokenized - received) * 1e3,
        "ipc_ms": NAN,
        "scheduler_wait_ms": (scheduled - tokenized) * 1e3,
        "prefill_ms": (first - scheduled) * 1e3,
        "decode_ms": (finished - first) * 1e3,
        "detokenize_ms": NAN,
        "frontend_ms": (received - r.sent) * 1e3,
        "send_lag_ms": (r.sent - r.scheduled) * 1e3,
        "replica": r.meta.get("replica", NAN),
        "server_first_token": server_first,
        "server_last_token": server_last,
    }


def request_frame(records: list[RequestRecord], epoch0: float) -> pd.DataFrame:
    rows = [_request_row(r, epoch0) for r in records]
    return pd.DataFrame(rows, columns=[*REQUEST_COLUMNS, *BENCH_COLUMNS, *SERVER_TOKEN_COLUMNS])


def itl_seconds(records: list[RequestRecord]) -> np.ndarray:
    """Gaps between consecutive text chunks of each completed request, at the client."""
    gaps = [np.diff(r.chunk_times) for r in records if r.status == "completed"]
    return np.concatenate(gaps) if gaps else np.zeros(0)


def step_frame(records: list[RequestRecord], epoch0: float) -> pd.DataFrame:
    """Steps rebuilt from the server's token times (empty without ``meta_info``)."""
    times: list[float] = []
    firsts: list[bool] = []
    prefill: list[int] = []
    for r in records:
        stamps = r.meta.get("token_times") or []
        new = int(r.meta.get("prompt_tokens") or 0) - int(r.meta.get("cached_tokens") or 0)
        for i, t in enumerate(stamps):
            times.append(float(t) - epoch0)
            firsts.append(i == 0)
            prefill.append(new if i == 0 else 0)
    if not times:
        return pd.DataFrame(columns=list(STEP_COLUMNS))
    tokens = pd.DataFrame({"end": times, "first": firsts, "prefill": prefill})
    steps = tokens.groupby("end", sort=True).agg(
        batch_size=("first", "size"), new=("first", "sum"), prefill_tokens=("prefill", "sum")
    )
    ends = steps.index.to_numpy(dtype=np.float64)
    starts = _step_starts(records, ends, epoch0)
    running = _running_at(records, starts, epoch0)
    frame = pd.DataFrame({c: np.full(len(ends), NAN) for c in STEP_COLUMNS})
    frame["step"] = np.arange(len(ends))
    frame["time"] = starts
    frame["duration_s"] = ends - starts
    frame["batch_size"] = steps["batch_size"].to_numpy()
    frame["prefill_tokens"] = steps["prefill_tokens"].to_numpy()
    frame["decode_requests"] = (steps["batch_size"] - steps["new"]).to_numpy()
    frame["num_running"] = running
    frame["blocked"] = ""
    return frame


def _spans(records: list[RequestRecord], epoch0: float) -> tuple[np.ndarray, np.ndarray]:
    """(first scheduled, last token) of every request the server scheduled."""
    pairs = [
        (float(r.meta["first_scheduled"]) - epoch0, float(r.meta["token_times"][-1]) - epoch0)
        for r in records
        if r.meta.get("first_scheduled") and r.meta.get("token_times")
    ]
    arr = np.array(pairs, dtype=np.float64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def _step_starts(records: list[RequestRecord], ends: np.ndarray, epoch0: float) -> np.ndarray:
    """Each step starts at the previous end, or later if no request was scheduled then."""
    scheduled, _ = _spans(records, epoch0)
    scheduled = np.sort(scheduled)
    previous = np.concatenate(([-np.inf], ends[:-1]))
    # the earliest first-scheduled time after the previous end bounds an idle engine's start
    idx = np.searchsorted(scheduled, previous, side="right")
    busy = _running_at(records, previous, epoch0) > 0
    after = np.where(idx < len(scheduled), scheduled[np.minimum(idx, len(scheduled) - 1)], ends)
    start = np.where(busy, previous, np.minimum(after, ends))
    return np.where(np.isfinite(start), start, ends)


def _running_at(records: list[RequestRecord], times: np.ndarray, epoch0: float) -> np.ndarray:
    """Requests first scheduled at or before each time whose last token came after it."""
    scheduled, last = _spans(records, epoch0)
    began = np.searchsorted(np.sort(scheduled), times, side="right")
    ended = np.searchsorted(np.sort(last), times, side="right")
    return began - ended
