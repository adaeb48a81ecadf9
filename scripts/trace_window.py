"""Cut a window out of a trace file, in its own format: rows ``skip`` .. ``skip + limit``.

    python3 scripts/trace_window.py traces/azure_code.csv --skip 3345 --limit 300 \\
        --out build/azure_code_busy.csv

Azure CSV keeps its header; JSONL keeps its lines as they are. Both readers take
arrivals relative to the first request, so the window starts at 0. The rows of
both published formats are in arrival order, so a row window is a time window.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--skip", type=int, default=0, help="requests to leave out first")
    ap.add_argument("--limit", type=int, required=True, help="requests to keep")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.skip < 0 or args.limit < 1:
        ap.error("need --skip >= 0 and --limit >= 1")
    with args.trace.open(encoding="utf-8") as f:
        header = [next(f)] if args.trace.suffix == ".csv" else []
        rows = [line for line in f if line.strip()]
    kept = list(itertools.islice(rows, args.skip, args.skip + args.limit))
    if len(kept) < args.limit:
        ap.error(f"{args.trace} has {len(rows)} requests, fewer than skip + limit")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(header + kept), encoding="utf-8")
    print(f"wrote requests {args.skip}..{args.skip + args.limit - 1} of {args.trace} to {args.out}")


if __name__ == "__main__":
    main()
