"""The request table's columns and the summary of a run, real or simulated.

Definitions (as common serving benchmarks use them): TTFT = first token at the
client - arrival; TPOT = (E2E - TTFT) / (output tokens - 1), for requests with
more than one token; ITL = gaps between streamed chunks (tokens of one step
arrive together); E2E = last token at the client - arrival. Goodput counts
completed requests per second that meet every SLO given (a bound left out is
not checked; TPOT is not checked for one-token requests); SLO attainment is
the fraction of all requests that do (a rejected request is a miss).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from schema.samples import Samples, WeightedSamples

TIME_COLUMNS = (
    "arrival",
    "tokenize_start",
    "tokenized",
    "sched_arrival",
    "first_scheduled",
    "first_token",
    "finished",
)
"""Time stamps of ``requests.csv``, in seconds from the trace's start."""
REQUEST_COLUMNS = (
    "rid",
    "status",
    "reason",
    *TIME_COLUMNS,
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "num_preemptions",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "tokenizer_queue_ms",
    "tokenize_ms",
    "ipc_ms",
    "scheduler_wait_ms",
    "prefill_ms",
    "decode_ms",
    "detokenize_ms",
    "frontend_ms",
)
SERVER_TOKEN_COLUMNS = ("server_first_token", "server_last_token")
"""When the server gave a request its first and its last token (the end of the scheduler step
that produced it), on the run's clock: extra columns of ``requests.csv`` where the server
reports token times. Client time minus these is the token's way out (detokenizer, IPC,
streaming)."""


def _stats(samples: Samples) -> dict[str, float | None]:
    s = samples.finite()
    if s.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = s.percentile([50, 90, 99])
    return {"mean": s.mean(), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def summarize(
    requests: pd.DataFrame,
    itl_s: Samples,
    *,
    num_steps: int,
    prefix_hit_rate: float,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
) -> dict[str, Any]:
    """The headline numbers of ``summary.json`` (config and provenance are added by the caller)."""
    done = requests[requests["status"] == "completed"]
    ends = requests["finished"].to_numpy()
    start = float(requests["arrival"].min()) if len(requests) else 0.0
    end = float(np.nanmax(ends)) if np.isfinite(ends).any() else start
    duration = max(end - start, 0.0)

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    good = np.ones(len(done), dtype=bool)
    if slo_ttft_ms is not None:
        good &= done["ttft_ms"].to_numpy() <= slo_ttft_ms
    if slo_tpot_ms is not None:
        tpot = done["tpot_ms"].to_numpy()
        good &= np.isnan(tpot) | (tpot <= slo_tpot_ms)
    rejected = requests[requests["status"] == "rejected"]
    reasons = rejected["reason"].str.replace(r"^request \S+: ", "", regex=True)
    summary: dict[str, Any] = {
        "num_requests": len(requests),
        "completed": len(done),
        "rejected": len(rejected),
        "rejected_reasons": {str(k): int(v) for k, v in reasons.value_counts().items()},
        "duration_s": duration,
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(float(done["output_tokens"].sum())),
        "input_throughput": per_s(float(done["input_tokens"].sum())),
        "goodput": {
            "value": per_s(float(good.sum())),
            "attainment": float(good.sum()) / len(requests) if len(requests) else 0.0,
            "slo_ttft_ms": slo_ttft_ms,
            "slo_tpot_ms": slo_tpot_ms,
        },
        "prefix_hit_rate": prefix_hit_rate,
        "num_steps": num_steps,
    }
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        summary[key] = _stats(WeightedSamples.of(done[key].to_numpy(dtype=np.float64)))
    summary["itl_ms"] = _stats(itl_s.scaled(1e3))
    return summary
