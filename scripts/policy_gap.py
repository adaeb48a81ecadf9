"""The difference between two policies' latency, real against simulated, from two validations.

    python scripts/policy_gap.py ROUND_ROBIN_DIR CACHE_AWARE_DIR [--metric ttft_ms] [--quantile p90]

Each folder holds the ``comparison.json`` of a ``sim validate`` of one policy (live, or
``--real-from`` the runs of several folders). Prints each policy's real and simulated
value of the metric and their relative error, then the first policy's value minus the
second's in both worlds, and the simulated difference's error against the real one: the
figure the cluster's policy target is stated in.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def real_and_sim(folder: Path, metric: str, quantile: str) -> tuple[float, float]:
    """The real and the simulated value of ``metric`` at ``quantile`` in ``folder``."""
    path = folder / "comparison.json"
    if not path.is_file():
        raise ValueError(f"{folder} holds no comparison.json of a sim validate")
    comparison = json.loads(path.read_text())
    try:
        entry = comparison[metric][quantile]
        return float(entry["real"]), float(entry["sim"])
    except (KeyError, TypeError):
        raise ValueError(f"{path} has no {metric} {quantile}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("first", type=Path, help="the validation of the first policy")
    p.add_argument("second", type=Path, help="the validation of the second policy")
    p.add_argument("--metric", default="ttft_ms")
    p.add_argument("--quantile", default="p90", help="p50, p90, p99 or mean")
    args = p.parse_args(argv)
    try:
        first = real_and_sim(args.first, args.metric, args.quantile)
        second = real_and_sim(args.second, args.metric, args.quantile)
    except ValueError as exc:
        print(f"policy_gap: error: {exc}", file=sys.stderr)
        return 2
    name = f"{args.metric} {args.quantile}"
    for folder, (real, sim) in ((args.first, first), (args.second, second)):
        print(f"{folder}: {name} real {real:,.1f}, simulated {sim:,.1f} ({sim / real - 1:+.1%})")
    real, sim = first[0] - second[0], first[1] - second[1]
    error = f"{sim / real - 1:+.1%}" if real else "undefined (no real difference)"
    print(f"difference: real {real:,.1f}, simulated {sim:,.1f}, error {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
