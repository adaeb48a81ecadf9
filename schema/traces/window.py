"""A row window of a trace file, in its own format, starting at 0 (``sim trace window``).

A CSV window keeps the header and the rows as they are (the Azure reader takes
arrivals relative to the first row); a JSONL window keeps its lines but for the
timestamp, less the window's first (the JSONL reader takes timestamps as they are).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from schema.traces.load import detect_format
from schema.traces.record import TraceError


def from_zero(trace: Path, lines: list[str]) -> list[str]:
    """JSONL request ``lines`` with every timestamp less the earliest, other fields as they are
    (the lines themselves when the earliest is 0 already)."""
    requests = [json.loads(line) for line in lines]
    stamps: list[float] = []
    for r in requests:
        t = r.get("timestamp") if isinstance(r, dict) else None
        if not isinstance(t, int | float) or isinstance(t, bool):
            raise TraceError(trace, None, "a request line has no numeric 'timestamp'")
        stamps.append(t)
    start = min(stamps)
    if not start:
        return lines
    return [
        json.dumps(r | {"timestamp": t - start}) + "\n"
        for r, t in zip(requests, stamps, strict=True)
    ]


def cut_window(trace: Path, skip: int, limit: int) -> list[str]:
    """The lines of requests ``skip`` .. ``skip + limit`` of ``trace``, after a CSV's header."""
    if skip < 0 or limit < 1:
        raise ValueError("need --skip >= 0 and --limit >= 1")
    if not trace.is_file():
        raise TraceError(trace, None, "no such trace file")
    csv = detect_format(trace) == "azure-csv"
    with trace.open(encoding="utf-8") as f:
        header = [next(f, "")] if csv else []
        rows = [line if line.endswith("\n") else line + "\n" for line in f if line.strip()]
    kept = list(itertools.islice(rows, skip, skip + limit))
    if len(kept) < limit:
        raise TraceError(trace, None, f"{len(rows)} requests, fewer than skip + limit")
    return header + (kept if csv else from_zero(trace, kept))
