"""Read the Azure LLM inference trace CSV as published.

Columns ``TIMESTAMP,ContextTokens,GeneratedTokens``; ``TIMESTAMP`` is an absolute
datetime such as ``2023-11-16 18:17:03.9799600`` (7 fractional digits, i.e. 100 ns
ticks). Arrival times are relative to the file's first row.
"""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

from schema.traces.record import TraceError, TraceRequest

HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
_EPOCH = dt.datetime(1970, 1, 1)


TICKS_PER_S = 10_000_000


def parse_azure_timestamp(text: str) -> int:
    """An Azure timestamp as an integer count of 100 ns ticks since 1970 (exact)."""
    whole, _, frac = text.strip().partition(".")
    if len(whole) != 19 or whole[10] != " ":
        raise ValueError("expected YYYY-MM-DD HH:MM:SS")
    base = dt.datetime.fromisoformat(whole)
    if frac and (not frac.isdigit() or len(frac) > 7):
        raise ValueError(f"bad fractional seconds {frac!r}")
    seconds = (base - _EPOCH) // dt.timedelta(seconds=1)
    return seconds * TICKS_PER_S + (int(frac.ljust(7, "0")) if frac else 0)


def _count(text: str, name: str, path: Path, line: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TraceError(path, line, f"{name} must be an integer, got {text!r}") from None
    if value < 0:
        raise TraceError(path, line, f"{name} must be >= 0, got {value}")
    return value


def read_azure_csv(path: Path) -> list[TraceRequest]:
    """All requests of an Azure CSV trace, in file order, arrivals from the first row."""
    out: list[TraceRequest] = []
    with path.open("r", encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip().lstrip("\ufeff") for h in header] != HEADER:
            raise TraceError(path, 1, f"expected header {','.join(HEADER)}, got {header!r}")
        first: int | None = None
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != 3:
                raise TraceError(path, line, f"expected 3 columns, got {len(row)}")
            try:
                t = parse_azure_timestamp(row[0])
            except ValueError as exc:
                raise TraceError(path, line, f"bad TIMESTAMP {row[0]!r} ({exc})") from None
            if first is None:
                first = t
            arrival = (t - first) / TICKS_PER_S
            if arrival < 0:
                raise TraceError(path, line, "TIMESTAMP is earlier than the first row's")
            out.append(
                TraceRequest(
                    rid=f"L{line}",
                    arrival=arrival,
                    input_length=_count(row[1], "ContextTokens", path, line),
                    output_length=_count(row[2], "GeneratedTokens", path, line),
                    line=line,
                )
            )
    return out
