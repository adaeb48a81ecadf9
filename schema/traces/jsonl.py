"""Read JSONL traces with Mooncake's field names.

One JSON object a line: ``timestamp`` (ms from the trace start), ``input_length``,
``output_length``, optional ``hash_ids`` (one id per 512-token prompt block),
``prompt`` or ``messages`` (text, used by the real engine only), ``rid`` and
``priority``. Blank lines are skipped; every other line must be a valid request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schema.traces.record import TraceError, TraceRequest


def _int_field(obj: dict[str, Any], name: str, path: Path, line: int) -> int:
    if name not in obj:
        raise TraceError(path, line, f"missing field {name!r}")
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(path, line, f"{name!r} must be an integer, got {value!r}")
    if value < 0:
        raise TraceError(path, line, f"{name!r} must be >= 0, got {value}")
    return value


def parse_jsonl_line(obj: Any, path: Path, line: int) -> TraceRequest:
    """Validate one decoded JSON line; raise ``TraceError`` naming ``path:line``."""
    if not isinstance(obj, dict):
        raise TraceError(path, line, f"expected a JSON object, got {type(obj).__name__}")
    ts = obj.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise TraceError(path, line, f"'timestamp' (ms) must be a number, got {ts!r}")
    if ts < 0 or ts != ts:
        raise TraceError(path, line, f"'timestamp' must be >= 0, got {ts!r}")
    input_length = _int_field(obj, "input_length", path, line)
    output_length = _int_field(obj, "output_length", path, line)
    hash_ids: tuple[int, ...] = ()
    if "hash_ids" in obj:
        raw = obj["hash_ids"]
        if not isinstance(raw, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in raw
        ):
            raise TraceError(path, line, "'hash_ids' must be a list of integers")
        hash_ids = tuple(raw)
    rid = obj.get("rid", f"L{line}")
    if not isinstance(rid, str | int) or isinstance(rid, bool) or rid == "":
        raise TraceError(path, line, f"'rid' must be a non-empty string, got {rid!r}")
    priority = obj.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TraceError(path, line, f"'priority' must be an integer, got {priority!r}")
    return TraceRequest(
        rid=str(rid),
        arrival=float(ts) / 1e3,
        input_length=input_length,
        output_length=output_length,
        hash_ids=hash_ids,
        priority=priority,
        line=line,
    )


def read_jsonl(path: Path) -> list[TraceRequest]:
    """All requests of a JSONL trace, in file order."""
    out: list[TraceRequest] = []
    with path.open("r", encoding="utf-8") as f:
        for line_no, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(path, line_no, f"not valid JSON ({exc.msg})") from None
            out.append(parse_jsonl_line(obj, path, line_no))
    return out
