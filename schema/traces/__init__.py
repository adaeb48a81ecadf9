"""Request traces: Mooncake-style JSONL, the Azure CSV, and synthetic generators."""

from __future__ import annotations

from schema.traces.load import detect_format, load_trace, scale_trace
from schema.traces.record import Trace, TraceError, TraceRequest
from schema.traces.synth import LengthSpec, arrival_times, generate

__all__ = [
    "LengthSpec",
    "Trace",
    "TraceError",
    "TraceRequest",
    "arrival_times",
    "detect_format",
    "generate",
    "load_trace",
    "scale_trace",
]
