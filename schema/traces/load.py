"""Load a trace file of either format, scale its rate and cut it to a limit."""

from __future__ import annotations

from pathlib import Path

from schema.traces.azure import read_azure_csv
from schema.traces.jsonl import read_jsonl
from schema.traces.record import Trace, TraceError, TraceRequest


def detect_format(path: Path) -> str:
    """``jsonl`` for .jsonl/.json files, ``azure-csv`` for .csv files."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    if suffix == ".csv":
        return "azure-csv"
    raise TraceError(path, None, f"unknown trace format {suffix!r} (expected .jsonl or .csv)")


def load_trace(path: Path | str, rate_scale: float = 1.0, limit: int | None = None) -> Trace:
    """Read ``path``, sort by arrival, keep the first ``limit`` requests, scale the rate.

    ``rate_scale`` X > 1 replays X times faster: every arrival time is divided by
    X (so the request rate is multiplied by X); token counts are unchanged.
    Request ids must be unique.
    """
    path = Path(path)
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if not path.is_file():
        raise TraceError(path, None, "no such trace file")
    fmt = detect_format(path)
    requests = read_jsonl(path) if fmt == "jsonl" else read_azure_csv(path)
    if not requests:
        raise TraceError(path, None, "the trace holds no requests")
    seen: dict[str, int] = {}
    for r in requests:
        if r.rid in seen:
            raise TraceError(path, r.line, f"duplicate rid {r.rid!r} (first on line {seen[r.rid]})")
        seen[r.rid] = r.line
    requests.sort(key=lambda r: r.arrival)
    if limit is not None:
        requests = requests[:limit]
    trace = Trace(path=str(path), format=fmt, requests=requests, limit=limit)
    return scale_trace(trace, rate_scale)


def scale_trace(trace: Trace, rate_scale: float) -> Trace:
    """``trace`` replayed ``rate_scale`` times faster: arrivals divided by it (see load_trace)."""
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    if rate_scale == 1.0:
        return trace
    return Trace(
        path=trace.path,
        format=trace.format,
        requests=[_scaled(r, rate_scale) for r in trace.requests],
        rate_scale=trace.rate_scale * rate_scale,
        limit=trace.limit,
    )


def _scaled(r: TraceRequest, rate_scale: float) -> TraceRequest:
    return TraceRequest(
        rid=r.rid,
        arrival=r.arrival / rate_scale,
        input_length=r.input_length,
        output_length=r.output_length,
        hash_ids=r.hash_ids,
        priority=r.priority,
        line=r.line,
    )
