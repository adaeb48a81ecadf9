"""Real against simulated: the arithmetic of ``comparison.json``.

For each latency (``ttft_ms``, ``tpot_ms``, ``itl_ms``, ``e2e_ms``) and each
statistic (``mean``, ``p50``, ``p90``, ``p99``), and for the throughputs::

    real     = mean of the real runs' values
    sim      = the simulation's value
    rel_err  = (sim - real) / real
    noise    = max over pairs of real runs i < j of |r_i - r_j| / ((r_i + r_j) / 2)
               (None with one run): how far two measurements of the same thing differ

so ``comparison["ttft_ms"]["p50"]["rel_err"]`` (written ``ttft_ms.p50.rel_err``)
is the simulator's relative error on median TTFT. A value that is missing or
zero on the real side gives ``rel_err`` None. ``targets`` checks |rel_err|
against a bound for the metrics named in ``TARGET_KEYS``.
"""

from __future__ import annotations

import itertools
from typing import Any

LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
STATS = ("mean", "p50", "p90", "p99")
THROUGHPUTS = ("request_throughput", "output_throughput")
TARGET_KEYS = tuple(f"{m}.{q}" for m in ("ttft_ms", "tpot_ms", "e2e_ms") for q in ("p50", "p90"))
TARGET_BOUND = 0.10


def relative_error(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return (sim - real) / real


def noise(runs: list[float | None]) -> float | None:
    """The largest relative difference between two runs (None with fewer than two)."""
    values = [v for v in runs if v is not None]
    if len(values) < 2 or len(values) < len(runs):
        return None
    gaps = [abs(a - b) / ((a + b) / 2) for a, b in itertools.combinations(values, 2) if a + b]
    return max(gaps, default=0.0)


def entry(runs: list[float | None], sim: float | None) -> dict[str, Any]:
    known = [v for v in runs if v is not None]
    real = sum(known) / len(known) if known and len(known) == len(runs) else None
    return {
        "real": real,
        "sim": sim,
        "rel_err": relative_error(sim, real),
        "noise": noise(runs),
        "real_runs": runs,
    }


def compare(real: list[dict[str, Any]], sim: dict[str, Any]) -> dict[str, Any]:
    """The comparison of the real runs' summaries with the simulation's summary."""
    if not real:
        raise ValueError("no real run to compare with")
    out: dict[str, Any] = {}
    for metric in LATENCIES:
        out[metric] = {q: entry([r[metric][q] for r in real], sim[metric][q]) for q in STATS}
    for key in THROUGHPUTS:
        out[key] = entry([r[key] for r in real], sim[key])
    out["targets"] = targets(out)
    return out


def lookup(comparison: dict[str, Any], key: str) -> dict[str, Any]:
    """``comparison`` entry at a dotted key such as ``ttft_ms.p50``."""
    node = comparison
    for part in key.split("."):
        node = node[part]
    return node


def targets(comparison: dict[str, Any], bound: float = TARGET_BOUND) -> dict[str, Any]:
    """Which of ``TARGET_KEYS`` are within ``bound``; the worst one."""
    errors = {k: lookup(comparison, k)["rel_err"] for k in TARGET_KEYS}
    missed = [k for k, e in errors.items() if e is None or abs(e) > bound]
    known = {k: abs(e) for k, e in errors.items() if e is not None}
    return {
        "bound": bound,
        "keys": list(TARGET_KEYS),
        "met": not missed,
        "missed": missed,
        "worst": max(known, key=known.__getitem__) if known else None,
    }


def format_comparison(comparison: dict[str, Any]) -> str:
    """A table of real, sim, relative error and noise, one row per metric and statistic."""

    def num(v: float | None, pct: bool = False) -> str:
        if v is None:
            return "-"
        return f"{v:+.1%}" if pct else f"{v:,.2f}"

    lines = [f"{'metric':<22}{'real':>12}{'sim':>12}{'rel err':>10}{'noise':>10}"]
    keys = [f"{m}.{q}" for m in LATENCIES for q in STATS] + list(THROUGHPUTS)
    for key in keys:
        e = lookup(comparison, key)
        noise_text = "-" if e["noise"] is None else f"{e['noise']:.1%}"
        lines.append(
            f"{key:<22}{num(e['real']):>12}{num(e['sim']):>12}"
            f"{num(e['rel_err'], pct=True):>10}{noise_text:>10}"
        )
    t = comparison["targets"]
    verdict = "met" if t["met"] else f"missed on {', '.join(t['missed'])}"
    lines.append(f"targets (|rel err| <= {t['bound']:.0%} on {', '.join(t['keys'])}): {verdict}")
    return "\n".join(lines)
