"""One Chrome/Perfetto timeline (JSON) for a real run and its simulation.

Both ``engine bench`` and ``sim replay`` write ``timeline.json`` from their
``requests.csv`` and ``steps.csv`` frames, in one schema (Chrome trace event
format, times in microseconds from the run's start), so the two open side by
side in https://ui.perfetto.dev or ``chrome://tracing``:

- process 1 ``requests``: each request is a row of four slices on a lane (a
  lane holds one request at a time), ``queue+tokenize`` (arrival ->
  tokenized), ``scheduler wait`` (-> first scheduled), ``prefill`` (-> first
  token) and ``decode`` (-> finished); a slice whose ends are unknown is left
  out. Args: the rid, and on the first slice token counts, TTFT and E2E.
- process 2 ``engine``: thread ``steps`` has one slice per scheduler step
  (named ``prefill``, ``decode`` or ``mixed``; args: batch size, prefill
  tokens, decode requests, ``steps``), a run of back-to-back decode steps of
  one batch being one slice with ``steps`` > 1; the counters ``batch`` (batch
  size, running, waiting) and ``kv pages`` (pages used, at the slice's end)
  change at each slice.

``metadata.source`` names the world (``engine bench`` or ``sim replay``).
"""

from __future__ import annotations

import heapq
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from schema.frames import numeric

TIMELINE_NAME = "timeline.json"
STAGES = (
    ("queue+tokenize", "arrival", "tokenized"),
    ("scheduler wait", "tokenized", "first_scheduled"),
    ("prefill", "first_scheduled", "first_token"),
    ("decode", "first_token", "finished"),
)
REQUEST_ARGS = ("input_tokens", "output_tokens", "cached_tokens", "ttft_ms", "e2e_ms")
REQUESTS_PID, ENGINE_PID, STEPS_TID = 1, 2, 1


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _clean(values: dict[str, Any]) -> dict[str, Any]:
    """Args without NaNs, integers as ints."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        f = float(v)
        if math.isfinite(f):
            out[k] = int(f) if f.is_integer() else f
    return out


def _lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The lowest free lane for each interval, in order of start (greedy interval packing)."""
    lanes = np.zeros(len(starts), dtype=np.int64)
    busy: list[tuple[float, int]] = []  # (end, lane) of lanes in use
    free: list[int] = []
    used = 0
    for i in np.argsort(starts, kind="stable"):
        while busy and busy[0][0] <= starts[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lane = heapq.heappop(free) if free else used
        used = max(used, lane + 1)
        lanes[i] = lane
        heapq.heappush(busy, (ends[i], lane))
    return lanes


def request_events(requests: pd.DataFrame) -> list[dict[str, Any]]:
    times = {c: numeric(requests, c) for c in {c for _, a, b in STAGES for c in (a, b)}}
    start = times["arrival"]
    end = np.fmax(numeric(requests, "finished"), start)
    ok = np.isfinite(start)
    lanes = np.zeros(len(requests), dtype=np.int64)
    lanes[ok] = _lanes(start[ok], np.where(np.isfinite(end[ok]), end[ok], start[ok]))
    args = {c: numeric(requests, c) for c in REQUEST_ARGS}
    rids = requests["rid"].astype(str).to_numpy()
    events: list[dict[str, Any]] = []
    for i in np.flatnonzero(ok):
        extra = {"rid": rids[i]} | _clean({c: args[c][i] for c in REQUEST_ARGS})
        for name, a, b in STAGES:
            t0, t1 = times[a][i], times[b][i]
            if math.isfinite(t0) and math.isfinite(t1) and t1 >= t0:
                events.append({"name": name, "cat": "request", "ph": "X", "pid": REQUESTS_PID,
                               "tid": int(lanes[i]), "ts": _us(t0), "dur": _us(t1 - t0),
                               "args": extra})  # fmt: skip
                extra = {"rid": rids[i]}
    return events


def _runs(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Index of the first step of each run of back-to-back steps of one shape and state."""
    keys = ("batch_size", "prefill_tokens", "decode_requests", "num_running", "num_waiting")
    same = np.ones(len(cols["time"]) - 1, dtype=bool)
    for k in keys:
        v = cols[k]
        same &= (v[1:] == v[:-1]) | (np.isnan(v[1:]) & np.isnan(v[:-1]))
    ends = cols["time"][:-1] + cols["duration_s"][:-1]
    same &= np.isclose(cols["time"][1:], ends, rtol=0, atol=1e-9)
    same &= cols["prefill_tokens"][1:] <= 0
    return np.flatnonzero(np.concatenate(([True], ~same)))


def step_events(steps: pd.DataFrame, pid: int = ENGINE_PID) -> list[dict[str, Any]]:
    """Runs of identical back-to-back decode steps become one slice (``args.steps``)."""
    names = ("time", "duration_s", "batch_size", "prefill_tokens", "decode_requests",
             "num_running", "num_waiting", "kv_pages_used")  # fmt: skip
    cols = {c: numeric(steps, c) for c in names}
    keep = np.isfinite(cols["time"]) & np.isfinite(cols["duration_s"])
    cols = {c: v[keep] for c, v in cols.items()}
    if not len(cols["time"]):
        return []
    firsts = _runs(cols)
    lasts = np.concatenate((firsts[1:], [len(cols["time"])])) - 1
    events: list[dict[str, Any]] = []
    for i, j in zip(firsts, lasts, strict=True):
        prefill, decode = cols["prefill_tokens"][i], cols["decode_requests"][i]
        name = "mixed" if prefill > 0 and decode > 0 else "prefill" if prefill > 0 else "decode"
        ts = _us(cols["time"][i])
        end = cols["time"][j] + cols["duration_s"][j]
        shape = _clean({k: cols[k][i] for k in ("batch_size", "prefill_tokens", "decode_requests")})
        events.append({"name": name, "cat": "step", "ph": "X", "pid": pid,
                       "tid": STEPS_TID, "ts": ts, "dur": _us(end - cols["time"][i]),
                       "args": shape | {"steps": int(j - i + 1)}})  # fmt: skip
        batch = _clean({k: cols[k][i] for k in ("batch_size", "num_running", "num_waiting")})
        events.append({"name": "batch", "ph": "C", "pid": pid, "ts": ts, "args": batch})
        pages = _clean({"used": cols["kv_pages_used"][j]})
        if pages:
            events.append({"name": "kv pages", "ph": "C", "pid": pid, "ts": ts,
                           "args": pages})  # fmt: skip
    return events


def _meta(kind: str, pid: int, name: str, tid: int = 0) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def _names() -> list[dict[str, Any]]:
    return [
        _meta("process_name", REQUESTS_PID, "requests"),
        _meta("process_name", ENGINE_PID, "engine"),
        _meta("thread_name", ENGINE_PID, "steps", STEPS_TID),
    ]


def _engine_events(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """The steps as one engine, or (a ``replica`` column) one engine per replica."""
    if "replica" not in steps.columns:
        return step_events(steps)
    events = []
    for replica, rows in steps.groupby("replica", sort=True):
        pid = ENGINE_PID + int(replica)
        events += [_meta("process_name", pid, f"engine (replica {replica})"),
                   _meta("thread_name", pid, "steps", STEPS_TID)]  # fmt: skip
        events += step_events(rows, pid)
    return events


def write_timeline(
    path: Path, requests: pd.DataFrame, steps: pd.DataFrame, source: str, **metadata: Any
) -> None:
    """Write the timeline of one run (``source``: ``engine bench`` or ``sim replay``)."""
    events = _names() + request_events(requests) + _engine_events(steps)
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "metadata": {"source": source, **metadata}}  # fmt: skip
    Path(path).write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
