"""Cut a window out of a trace file, in its own format: rows SKIP .. SKIP + LIMIT.

Azure CSV keeps its header and rows as they are (its reader takes arrivals
relative to the first row); JSONL keeps its lines but for the timestamp, moved so
that the window's first request arrives at 0 (its reader takes timestamps as
they are). Either way the window starts at 0. The rows of both published formats
are in arrival order, so a row window is a time window.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from schema.traces.load import detect_format
from schema.traces.record import TraceError

EXAMPLE = """example:
  sim trace window traces/azure_code.csv --skip 3345 --limit 300 --out build/azure_code_busy.csv"""


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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim trace window``: its flags and its handler."""
    p = sub.add_parser(
        "window",
        help="cut rows SKIP .. SKIP + LIMIT out of a trace, in its own format",
        description=__doc__,
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=Path, help="a .jsonl (Mooncake fields) or Azure .csv trace")
    p.add_argument("--skip", type=int, default=0, help="requests to leave out first (default 0)")
    p.add_argument("--limit", type=int, required=True, help="requests to keep")
    p.add_argument("--out", type=Path, required=True, help="the window's trace file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        lines = cut_window(args.trace, args.skip, args.limit)
    except (OSError, ValueError) as exc:
        print(f"sim trace window: error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(lines), encoding="utf-8")
    last = args.skip + args.limit - 1
    print(f"wrote requests {args.skip}..{last} of {args.trace} to {args.out}")
    return 0
