"""Where the router put each request, real against simulated (``comparison["placement"]``).

With several replicas a latency error can come from the router rather than the
replicas: a policy that reads the load at each arrival (``cache_aware``,
``least_outstanding``) places a request elsewhere once the simulated timing
differs a little, and a replica that gets more work has longer queues and
larger decode batches. So for a run of N > 1 replicas the comparison holds,
per replica, the work placed on it in each world (requests, output tokens,
prompt tokens not found in its cache) and its TTFT and TPOT medians, and the
share of requests the simulation placed on the same replica as the real run
(``same_replica``: from the ``replica`` column that this engine's frontend
reports, ``engine serve --dp N``; the simulated replicas renamed to match
best; None where the server does not say).
"""

from __future__ import annotations

from itertools import permutations
from typing import Any

import numpy as np
import pandas as pd

COLUMN = "replica"
MAX_RENAMED = 7
"""Up to this many replicas, ``same_replica`` tries every renaming (7! = 5,040)."""


def _work(requests: pd.DataFrame, replica: int) -> dict[str, float | int | None]:
    mine = requests[requests[COLUMN] == replica]
    done = mine[mine["status"] == "completed"]

    def median(column: str) -> float | None:
        values = done[column].to_numpy(np.float64)
        values = values[np.isfinite(values)]
        return float(np.median(values)) if values.size else None

    return {
        "requests": len(mine),
        "output_tokens": int(done["output_tokens"].sum()),
        "uncached_tokens": int((done["input_tokens"] - done["cached_tokens"]).sum()),
        "ttft_ms_p50": median("ttft_ms"),
        "tpot_ms_p50": median("tpot_ms"),
    }


def same_replica(real: pd.DataFrame, sim: pd.DataFrame) -> float | None:
    """The share of the real run's placed requests that the simulation placed alike, the
    simulated replicas renamed to match the real ones best (replicas are alike, and where a
    router starts is arbitrary: a server's round robin has already placed the warm-up)."""
    if COLUMN not in real or real[COLUMN].isna().all():
        return None
    placed = real.dropna(subset=[COLUMN]).set_index("rid")[COLUMN].astype(int)
    simulated = sim.set_index("rid")[COLUMN].reindex(placed.index)
    if not len(placed):
        return None
    n = int(max(placed.max(), simulated.max())) + 1
    if n > MAX_RENAMED:
        return float((simulated == placed).mean())
    both = pd.crosstab(placed, simulated).reindex(index=range(n), columns=range(n), fill_value=0)
    counts = both.to_numpy()
    best = max(sum(counts[i, p[i]] for i in range(n)) for p in permutations(range(n)))
    return float(best / len(placed))


def placement(real: list[pd.DataFrame], sim: pd.DataFrame) -> dict[str, Any] | None:
    """Per replica, the real runs' work and the simulation's; the agreement per real run.
    None for one replica."""
    replicas = sorted(int(k) for k in sim[COLUMN].unique()) if COLUMN in sim else []
    if len(replicas) < 2:
        return None
    reported = [r for r in real if COLUMN in r and not r[COLUMN].isna().all()]
    return {
        "replicas": {
            str(k): {
                "real_runs": [_work(r, k) for r in reported],
                "sim": _work(sim, k),
            }
            for k in replicas
        },
        "same_replica": [same_replica(r, sim) for r in real],
    }


def _cell(real: dict[str, Any] | None, sim: dict[str, Any], key: str, spec: str) -> str:
    def text(v: float | int | None) -> str:
        return "-" if v is None else format(v, spec)

    return f"{text(None if real is None else real[key])} / {text(sim[key])}"


def format_placement(block: dict[str, Any] | None) -> str:
    """Requests, output tokens, uncached prompt tokens and TPOT P50 per replica (real run 1
    against the simulation), and the agreement."""
    if block is None:
        return ""
    lines = ["placement, real run 1 / sim: requests; output tokens; uncached prompt tokens; "
             "TPOT P50 (ms)"]  # fmt: skip
    for k, per in block["replicas"].items():
        r, s = (per["real_runs"] or [None])[0], per["sim"]
        specs = (("requests", ",d"), ("output_tokens", ",d"), ("uncached_tokens", ",d"),
                 ("tpot_ms_p50", ".1f"))  # fmt: skip
        cells = [_cell(r, s, key, spec) for key, spec in specs]
        lines.append(f"  replica {k}: " + "; ".join(cells))
    shares = ", ".join("-" if v is None else f"{v:.1%}" for v in block["same_replica"])
    lines.append(f"  placed on the same replica as the real run: {shares}")
    return "\n".join(lines)
