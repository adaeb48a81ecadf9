"""One trace request and a loaded trace: token counts and arrival times, no text."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HASH_BLOCK_TOKENS = 512
"""The prompt tokens each of a Mooncake trace's ``hash_ids`` stands for (the last one: what is
left of the prompt)."""


class TraceError(ValueError):
    """A trace file that cannot be read as is; the message names the file and line."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """A request of a trace.

    ``arrival`` is in seconds from the trace's start. ``hash_ids`` names one
    512-token prompt block each (Mooncake); equal ids mean a shared prefix.
    ``line`` is the 1-based line of the file the request came from.
    """

    rid: str
    arrival: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()
    priority: int = 0
    line: int = 0


@dataclass(frozen=True, slots=True)
class Trace:
    """Requests sorted by arrival (stable: equal arrivals keep file order)."""

    path: str
    format: str  # "jsonl" | "azure-csv"
    requests: list[TraceRequest] = field(default_factory=list)
    rate_scale: float = 1.0
    limit: int | None = None

    @property
    def duration_s(self) -> float:
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival - self.requests[0].arrival

    def describe(self) -> dict[str, object]:
        return {
            "path": self.path,
            "format": self.format,
            "num_requests": len(self.requests),
            "rate_scale": self.rate_scale,
            "limit": self.limit,
            "span_s": self.duration_s,
        }
