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

``ttft_parts`` splits TTFT at the two stage times both worlds record
(``requests.csv``), with the same statistics per part, so a TTFT error can be
traced to a stage: ``to_tokenized_ms`` (arrival to the end of tokenization:
HTTP, frontend, tokenizer queue and work), ``to_scheduled_ms`` (tokenized to
first scheduled: the hop to the scheduler and the wait for admission) and
``to_first_token_ms`` (first scheduled to the first token at the client:
prefill steps, detokenization, streaming).

``regime`` says whether each real run (and the simulation) was stable,
backlogged or overloaded (``lab.validate.regime``): an error measured in one
regime says nothing of another.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from lab.validate.regime import describe

if TYPE_CHECKING:
    import pandas as pd

LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
STATS = ("mean", "p50", "p90", "p99")
THROUGHPUTS = ("request_throughput", "output_throughput")
TARGET_KEYS = tuple(f"{m}.{q}" for m in ("ttft_ms", "tpot_ms", "e2e_ms") for q in ("p50", "p90"))
TARGET_BOUND = 0.10
TTFT_PARTS = {  # part -> (start column, end column) of requests.csv
    "to_tokenized_ms": ("arrival", "tokenized"),
    "to_scheduled_ms": ("tokenized", "first_scheduled"),
    "to_first_token_ms": ("first_scheduled", "first_token"),
}


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


def _part_stats(requests: pd.DataFrame, start: str, end: str) -> dict[str, float | None]:
    done = requests[requests["status"] == "completed"]
    ms = (done[end].to_numpy(np.float64) - done[start].to_numpy(np.float64)) * 1e3
    ms = ms[np.isfinite(ms)]
    if ms.size == 0:
        return dict.fromkeys(STATS)
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"mean": float(ms.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def ttft_parts(real: list[pd.DataFrame], sim: pd.DataFrame) -> dict[str, Any]:
    """TTFT split at ``tokenized`` and ``first_scheduled``: real runs against the simulation,
    each part with ``compare``'s statistics and errors (None where a server reports no
    stage times)."""
    out: dict[str, Any] = {}
    for part, (start, end) in TTFT_PARTS.items():
        runs = [_part_stats(r, start, end) for r in real]
        s = _part_stats(sim, start, end)
        out[part] = {q: entry([r[q] for r in runs], s[q]) for q in STATS}
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
    parts = comparison.get("ttft_parts", {})
    keys += [f"ttft_parts.{p}.{q}" for p in parts for q in ("p50", "p90")]
    for key in keys:
        e = lookup(comparison, key)
        noise_text = "-" if e["noise"] is None else f"{e['noise']:.1%}"
        lines.append(
            f"{key.removeprefix('ttft_parts.'):<22}{num(e['real']):>12}{num(e['sim']):>12}"
            f"{num(e['rel_err'], pct=True):>10}{noise_text:>10}"
        )
    t = comparison["targets"]
    verdict = "met" if t["met"] else f"missed on {', '.join(t['missed'])}"
    lines.append(f"targets (|rel err| <= {t['bound']:.0%} on {', '.join(t['keys'])}): {verdict}")
    if "regime" in comparison:
        lines.append(f"regime: {describe(comparison['regime'])}")
    return "\n".join(lines)
