"""What limits a run: the dominant latency stage and the binding limit, computed from the data.

Rules, applied in this order (thresholds are the module constants):

1. **tokenizer** - requests queue for a tokenizer worker: the tokenizer queue
   takes at least ``TOKENIZER_TTFT_SHARE`` of mean TTFT, at least
   ``MIN_QUEUE_WAIT_MS`` on average, and no less than the scheduler wait does,
   and the workers are busy at least ``TOKENIZER_BUSY_FRACTION`` of the run
   (their tokenize time over workers times the run; unknown counts as busy).
   Requests that queue so while the workers are idle more of the run are
   held back downstream: the verdict is **gpu_compute** (rule 3 without its
   waiting condition), and it says that more workers would not help.
2. **kv_memory**, **running_cap**, **prefill_budget** - the scheduler holds
   waiting requests back. Each gets a score, a fraction of steps:

   - kv_memory: max(steps blocked by ``kv_memory``, steps that preempt);
   - running_cap: steps blocked by ``running_cap`` with ``num_running >=
     max_running``, or with waiting requests and ``num_running >=
     max_running``. A step labelled ``running_cap`` below the cap contradicts
     itself; it is not counted, only reported as
     ``running_cap_below_cap_fraction``;
   - prefill_budget: steps blocked by ``prefill_budget``.

   The highest score wins if it reaches ``LIMIT_STEP_FRACTION``.
3. **gpu_compute** - the engine is busy (sum of step durations over the run's
   duration) at least ``GPU_BUSY_FRACTION`` while requests wait in at least
   ``WAITING_STEP_FRACTION`` of steps, and no admission limit above binds.
4. **queueing** - none of the above, yet the latency tails say requests queued:
   the P99 of each request's TTFT beyond the prefill of its own prompt
   (``queue_delays_ms``) reaches ``QUEUE_TAIL_MS`` and at least
   ``QUEUE_TAIL_SHARE`` of the TTFT P99. The queue sits where the step table
   does not look (before the scheduler, or in prefill chunks shared with other
   requests), e.g. an ``engine bench`` whose step record shows no waiting.
5. **none** - none of the above: requests are admitted without queueing
   (underloaded, or busy only with the running batch).

The dominant stage is the stage with the largest share of mean E2E (and,
separately, of mean TTFT); see ``stages.py`` for the stages.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from lab.report.stages import STAGE_BY_NAME, completed_requests, stage_means_ms, stage_shares
from schema.frames import as_float, blocked_mask, get_path, numeric
from schema.jsonsafe import json_safe

TOKENIZER_TTFT_SHARE = 0.30
"""Tokenizer queue wait, as a share of mean TTFT, from which the tokenizer workers bind."""
TOKENIZER_BUSY_FRACTION = 0.95
"""Share of the run the tokenizer workers are busy from which they bind (below it, what
queues for them is held back by a slower stage after them)."""
MIN_QUEUE_WAIT_MS = 5.0
"""A mean tokenizer queue wait below this is noise, whatever its share of TTFT."""
LIMIT_STEP_FRACTION = 0.10
"""Share of steps held back by an admission limit from which that limit binds."""
GPU_BUSY_FRACTION = 0.90
"""Engine busy share of the run from which the GPU counts as saturated."""
WAITING_STEP_FRACTION = 0.25
"""Share of steps with waiting requests from which a saturated GPU binds."""
QUEUE_TAIL_MS = 1_000.0
"""P99 of the TTFT beyond a request's own prefill from which requests count as queued."""
QUEUE_TAIL_SHARE = 0.5
"""... and its least share of the TTFT P99 (the tail is queueing, not long prompts)."""
PREFILL_RATE_QUANTILE = 0.10
"""A prompt's own prefill is its uncached tokens times this quantile of the run's prefill
time per uncached token (the pace of a prefill that did not share the engine)."""
KV_FULL_UTILIZATION = 0.95
"""KV pages used / total from which the cache counts as full (evidence only)."""

ADMISSION_LIMITS = ("kv_memory", "running_cap", "prefill_budget")
LIMIT_LABELS = {
    "kv_memory": "KV memory",
    "running_cap": "the running-request cap",
    "prefill_budget": "the prefill token budget",
    "tokenizer": "tokenizer workers",
    "gpu_compute": "GPU compute",
    "queueing": "requests queue (no limit identified)",
    "none": "none (underloaded)",
}


def _fraction(mask: np.ndarray) -> float:
    return float(mask.mean()) if mask.size else 0.0


def run_duration_s(summary: dict[str, Any], requests: pd.DataFrame, steps: pd.DataFrame) -> float:
    """``summary.duration_s``, else the span from first arrival to the last step or finish."""
    given = as_float(summary.get("duration_s"))
    if given is not None and given > 0:
        return given
    starts = [numeric(requests, "arrival"), numeric(steps, "time")]
    ends = [
        numeric(requests, "finished"),
        numeric(steps, "time") + numeric(steps, "duration_s", 0.0),
    ]
    lo = [float(np.nanmin(a)) for a in starts if np.isfinite(a).any()]
    hi = [float(np.nanmax(a)) for a in ends if np.isfinite(a).any()]
    if not lo or not hi or max(hi) <= min(lo):
        return float("nan")
    return max(hi) - min(lo)


def queue_stats(queues: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Time-weighted mean (first to last sample) and max of each stage's queue length."""
    out: dict[str, dict[str, float]] = {}
    if queues.empty or not {"time", "stage", "queue_len"} <= set(queues.columns):
        return out
    for stage, group in queues.groupby("stage", sort=True):
        g = group.sort_values("time", kind="stable")
        t = numeric(g, "time")
        v = numeric(g, "queue_len")
        dt = np.diff(np.append(t, np.nanmax(t)))
        dt = np.where(np.isfinite(dt) & (dt > 0), dt, 0.0)
        span = dt.sum()
        mean = float((np.nan_to_num(v) * dt).sum() / span) if span > 0 else float(np.nanmean(v))
        out[str(stage)] = {"mean": mean, "max": float(np.nanmax(v))}
    return out


def _quantile(values: np.ndarray, q: float) -> float:
    finite = values[np.isfinite(values)]
    return float(np.quantile(finite, q)) if finite.size else float("nan")


def queue_delays_ms(done: pd.DataFrame) -> np.ndarray:
    """Per completed request: TTFT less the prefill of its own prompt at the run's unshared
    pace (``PREFILL_RATE_QUANTILE`` of ``prefill_ms`` per uncached token; of ``ttft_ms`` per
    token when the prefill stage is not recorded). NaN where the tables lack the columns."""
    ttft = numeric(done, "ttft_ms")
    tokens = numeric(done, "input_tokens") - numeric(done, "cached_tokens", 0.0)
    tokens = np.where(np.isfinite(tokens), np.maximum(tokens, 1.0), np.nan)
    prefill = numeric(done, "prefill_ms")
    per_token = (prefill if np.isfinite(prefill).any() else ttft) / tokens
    pace = _quantile(per_token, PREFILL_RATE_QUANTILE)
    return np.asarray(ttft - tokens * pace, dtype=float)


def _tokenizers_busy(
    summary: dict[str, Any], done: pd.DataFrame, means: dict[str, float], duration: float
) -> float:
    """The tokenizer workers' busy share of the run: the completed requests' tokenize time
    over the workers times the run (NaN where unknown)."""
    workers = as_float(get_path(summary, "config", "num_tokenizers"))
    if not workers or not duration or not np.isfinite(duration):
        return float("nan")
    return means["tokenize"] * len(done) / 1e3 / (workers * duration)


def _evidence(
    summary: dict[str, Any], requests: pd.DataFrame, steps: pd.DataFrame, queues: pd.DataFrame
) -> dict[str, Any]:
    done = completed_requests(requests)
    duration = run_duration_s(summary, requests, steps)
    busy = float(np.nansum(numeric(steps, "duration_s", 0.0)))
    blocked = {r: blocked_mask(steps, r) for r in ADMISSION_LIMITS}
    waiting = numeric(steps, "num_waiting", 0.0) > 0
    running = numeric(steps, "num_running")
    batch = numeric(steps, "batch_size")
    used = numeric(steps, "kv_pages_used")
    total = numeric(steps, "kv_pages_total")
    with np.errstate(invalid="ignore", divide="ignore"):
        kv_util = np.where(total > 0, used / total, np.nan)
    preempted = numeric(steps, "preempted", 0.0)
    max_running = as_float(get_path(summary, "config", "max_running"))
    if max_running is not None:
        at_cap = waiting & (running >= max_running)
        below_cap = blocked["running_cap"] & (running < max_running)
    else:
        at_cap = below_cap = np.zeros(len(steps), dtype=bool)
    running_cap_steps = (blocked["running_cap"] & ~below_cap) | at_cap
    ttft_means = stage_means_ms(done)
    ttft = numeric(done, "ttft_ms")
    mean_ttft = float(np.nanmean(ttft)) if np.isfinite(ttft).any() else float("nan")
    total_preemptions = float(np.nansum(preempted))
    if total_preemptions == 0 and "num_preemptions" in requests.columns:
        total_preemptions = float(np.nansum(numeric(requests, "num_preemptions")))
    n_requests = len(requests)
    delay_p99 = _quantile(queue_delays_ms(done), 0.99)
    return {
        "duration_s": duration,
        "num_steps": len(steps),
        "busy_fraction": busy / duration if duration and duration > 0 else float("nan"),
        "waiting_step_fraction": _fraction(waiting),
        "mean_batch_size": float(np.nanmean(batch)) if np.isfinite(batch).any() else 0.0,
        "blocked_fraction": {r: _fraction(blocked[r]) for r in ADMISSION_LIMITS},
        "kv_peak_utilization": float(np.nanmax(kv_util)) if np.isfinite(kv_util).any() else None,
        "kv_mean_utilization": float(np.nanmean(kv_util)) if np.isfinite(kv_util).any() else None,
        "kv_full_waiting_fraction": _fraction(waiting & (kv_util >= KV_FULL_UTILIZATION)),
        "kv_pages_total": float(np.nanmax(total)) if np.isfinite(total).any() else None,
        "preemptions": total_preemptions,
        "preempted_step_fraction": _fraction(preempted > 0),
        "max_running": max_running,
        "running_at_cap_fraction": _fraction(at_cap),
        "running_cap_step_fraction": _fraction(running_cap_steps),
        "running_cap_below_cap_fraction": _fraction(below_cap),
        "mean_ttft_ms": mean_ttft,
        "ttft_p99_ms": _quantile(ttft, 0.99),
        "queue_delay_p99_ms": delay_p99,
        "tokenizer_busy_fraction": _tokenizers_busy(summary, done, ttft_means, duration),
        "tokenizer_queue_ms": ttft_means["tokenizer_queue"],
        "scheduler_wait_ms": ttft_means["scheduler_wait"],
        "tokenizer_queue_share_of_ttft": ttft_means["tokenizer_queue"] / mean_ttft
        if mean_ttft > 0
        else float("nan"),
        "scheduler_wait_share_of_ttft": ttft_means["scheduler_wait"] / mean_ttft
        if mean_ttft > 0
        else float("nan"),
        "queues": queue_stats(queues),
        "num_requests": n_requests,
        "rejected_fraction": 1.0 - len(done) / n_requests if n_requests else 0.0,
    }


def _limit_scores(ev: dict[str, Any]) -> dict[str, float]:
    b = ev["blocked_fraction"]
    return {
        "kv_memory": max(b["kv_memory"], ev["preempted_step_fraction"]),
        "running_cap": ev["running_cap_step_fraction"],
        "prefill_budget": b["prefill_budget"],
    }


def _tokenizer_queued(ev: dict[str, Any]) -> bool:
    """Requests queue for a tokenizer more than for the scheduler (rule 1's figures)."""
    tok = ev["tokenizer_queue_share_of_ttft"]
    sched = ev["scheduler_wait_share_of_ttft"]
    return bool(
        np.isfinite(tok)
        and tok >= TOKENIZER_TTFT_SHARE
        and ev["tokenizer_queue_ms"] >= MIN_QUEUE_WAIT_MS
        and not (np.isfinite(sched) and sched > tok)
    )


def _tokenizers_bind(ev: dict[str, Any]) -> bool:
    busy = ev["tokenizer_busy_fraction"]
    return not np.isfinite(busy) or busy >= TOKENIZER_BUSY_FRACTION


def _choose_limit(ev: dict[str, Any], scores: dict[str, float]) -> str:
    if _tokenizer_queued(ev):
        return "tokenizer" if _tokenizers_bind(ev) else "gpu_compute"
    best = max(ADMISSION_LIMITS, key=lambda k: scores[k])
    if scores[best] >= LIMIT_STEP_FRACTION:
        return best
    if _busy(ev) and ev["waiting_step_fraction"] >= WAITING_STEP_FRACTION:
        return "gpu_compute"
    if _queued(ev):
        return "queueing"
    return "none"


def _queued(ev: dict[str, Any]) -> bool:
    """The TTFT tail is queueing: rule 4 of the module docstring."""
    delay, ttft = ev["queue_delay_p99_ms"], ev["ttft_p99_ms"]
    return bool(
        np.isfinite(delay)
        and delay >= QUEUE_TAIL_MS
        and np.isfinite(ttft)
        and delay >= QUEUE_TAIL_SHARE * ttft
    )


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.0f}%"


def _duration(ms: float) -> str:
    if not np.isfinite(ms):
        return "n/a"
    return f"{ms / 1e3:,.1f} s" if ms >= 1_000 else f"{ms:,.0f} ms"


def _limit_sentence(limit: str, ev: dict[str, Any]) -> str:
    waits = (
        f" Requests wait {_duration(ev['scheduler_wait_ms'])} for admission on average."
        if limit in ADMISSION_LIMITS or limit == "gpu_compute"
        else ""
    )
    return _limit_clause(limit, ev) + waits


def _limit_clause(limit: str, ev: dict[str, Any]) -> str:
    b = ev["blocked_fraction"]
    busy_and_waiting = (
        f"the engine is busy {_pct(ev['busy_fraction'])} of the run and requests wait at "
        f"{_pct(ev['waiting_step_fraction'])} of steps."
    )
    name = LIMIT_LABELS.get(limit, limit)
    tokenizer_wait = (
        f"requests wait {ev['tokenizer_queue_ms']:.0f} ms for a tokenizer on average, "
        f"{_pct(ev['tokenizer_queue_share_of_ttft'])} of TTFT"
    )
    if limit == "tokenizer":
        why = f"{tokenizer_wait}{_tokenizers_share(ev)}: more workers raise throughput until "
        why += "the engine binds (`sim sweep` over num_tokenizers finds where)."
    elif limit == "gpu_compute" and _tokenizer_queued(ev):
        why = (
            f"{tokenizer_wait}, yet the workers are busy only "
            f"{_pct(ev['tokenizer_busy_fraction'])} of the run: the engine holds the "
            "throughput back and more tokenizer workers would not help."
        )
    elif limit == "kv_memory":
        pages = ev["kv_pages_total"]
        peak = f" of {pages:.0f}" if pages is not None else ""
        why = (
            f"admission blocked by KV memory at {_pct(b['kv_memory'])} of steps, KV pages peak "
            f"at {_pct(ev['kv_peak_utilization'])}{peak}, {ev['preemptions']:.0f} preemptions."
        )
    elif limit == "running_cap":
        cap = ev["max_running"]
        name += f" ({cap:.0f})" if cap is not None else ""
        why = (
            f"admission blocked by it at {_pct(ev['running_cap_step_fraction'])} of steps "
            "while requests wait."
        )
    elif limit == "prefill_budget":
        why = f"admission blocked by it at {_pct(b['prefill_budget'])} of steps."
    elif limit == "gpu_compute":
        why = busy_and_waiting
    elif limit == "queueing":
        steps = (
            f"the step table shows requests waiting at {_pct(ev['waiting_step_fraction'])} of "
            f"steps (engine busy {_pct(ev['busy_fraction'])})"
            if ev["num_steps"]
            else "the run has no step table"
        )
        return (
            f"No limit binds by the step table, but requests queue: TTFT P99 "
            f"{_duration(ev['ttft_p99_ms'])}, of which {_duration(ev['queue_delay_p99_ms'])} "
            f"(P99) beyond the prefill of the request's own prompt, while {steps}: the queue "
            "sits before the scheduler or in prefill shared with other requests."
        )
    elif _busy(ev):
        return (
            f"No limit binds: requests are admitted without queueing (they wait at "
            f"{_pct(ev['waiting_step_fraction'])} of steps), though the engine is busy "
            f"{_pct(ev['busy_fraction'])} of the run stepping its running batch "
            f"(mean {ev['mean_batch_size']:.1f} requests)."
        )
    else:
        return f"No limit binds (underloaded): {busy_and_waiting}"
    return f"Binding limit: {name} - {why}"


def _tokenizers_share(ev: dict[str, Any]) -> str:
    busy = ev["tokenizer_busy_fraction"]
    return f"; the workers are busy {_pct(busy)} of the run" if np.isfinite(busy) else ""


def _busy(ev: dict[str, Any]) -> bool:
    busy = ev["busy_fraction"]
    return bool(np.isfinite(busy) and busy >= GPU_BUSY_FRACTION)


def limit_label(limit: str, ev: dict[str, Any]) -> str:
    """A short name of the binding limit for headings."""
    if limit == "none" and _busy(ev):
        return "none (no queueing)"
    return LIMIT_LABELS.get(limit, limit)


def bottleneck_verdict(
    summary: dict[str, Any], requests: pd.DataFrame, steps: pd.DataFrame, queues: pd.DataFrame
) -> dict[str, Any]:
    """The run's bottleneck as a JSON-friendly dict (pure; see the module docstring for rules).

    Keys: ``dominant_stage`` and ``stage_shares`` (share of mean E2E per stage),
    ``dominant_ttft_stage`` and ``ttft_stage_shares``, ``binding_limit`` (one of
    ``LIMIT_LABELS``) and ``limit_label`` (its name in words), ``limit_scores``,
    ``evidence`` (the figures the rules read) and ``text`` (the verdict in
    words, with those figures).
    """
    done = completed_requests(requests)
    shares = stage_shares(done, "e2e_ms", ttft_only=False)
    ttft_shares = stage_shares(done, "ttft_ms", ttft_only=True)
    dominant = max(shares, key=lambda k: shares[k]) if any(shares.values()) else None
    dominant_ttft = (
        max(ttft_shares, key=lambda k: ttft_shares[k]) if any(ttft_shares.values()) else None
    )
    ev = _evidence(summary, requests, steps, queues)
    scores = _limit_scores(ev)
    limit = _choose_limit(ev, scores)
    parts = []
    if dominant is not None and dominant_ttft is not None:
        parts.append(
            f"{STAGE_BY_NAME[dominant].label.capitalize()} takes the largest share of mean E2E "
            f"({_pct(shares[dominant])}); {STAGE_BY_NAME[dominant_ttft].label} takes the largest "
            f"share of mean TTFT ({_pct(ttft_shares[dominant_ttft])})."
        )
    parts.append(_limit_sentence(limit, ev))
    verdict: dict[str, Any] = json_safe(
        {
            "dominant_stage": dominant,
            "stage_shares": shares,
            "dominant_ttft_stage": dominant_ttft,
            "ttft_stage_shares": ttft_shares,
            "binding_limit": limit,
            "limit_label": limit_label(limit, ev),
            "limit_scores": scores,
            "evidence": ev,
            "text": " ".join(parts),
        }
    )
    return verdict
