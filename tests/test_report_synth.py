"""Synthetic replay outputs for the report tests, and checks of the time binning.

``synthetic_run`` builds requests/steps/queues frames with the columns of the
replay contract from a ``Scenario``: the load shape (busy fraction, waiting,
blocked reasons, KV use, preemptions, queue waits) is drawn at random around
the scenario's figures, so a report sees realistic noisy data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lab.report import binning

MAX_RUNNING = 64
NUM_PAGES = 4096


@dataclass
class Scenario:
    """Knobs of a synthetic run; the defaults describe a lightly loaded run."""

    num_requests: int = 400
    num_steps: int = 5000
    duration_s: float = 60.0
    busy: float = 0.35
    waiting_fraction: float = 0.02
    blocked: dict[str, float] = field(default_factory=dict)
    kv_utilization: float = 0.3
    preempt_fraction: float = 0.0
    running_at_cap_fraction: float = 0.0
    running_cap_at_cap: bool = True
    """Steps blocked by the running cap run ``MAX_RUNNING`` requests, as the scheduler's do."""
    tokenizer_queue_ms: float = 0.5
    tokenize_ms_per_token: float = 0.002
    scheduler_wait_ms: float = 2.0
    rejected: int = 0
    seed: int = 0


@dataclass
class Run:
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    queues: pd.DataFrame
    itl: np.ndarray


def _requests(s: Scenario, rng: np.random.Generator) -> pd.DataFrame:
    n = s.num_requests
    arrival = np.sort(rng.uniform(0, s.duration_s * 0.9, n))
    inp = rng.integers(64, 4096, n)
    out = rng.integers(2, 512, n)
    cached = (inp * rng.uniform(0, 0.6, n)).astype(int)
    tq = rng.exponential(s.tokenizer_queue_ms, n)
    tok = inp * s.tokenize_ms_per_token
    ipc = rng.uniform(0.1, 0.4, n)
    sw = rng.exponential(s.scheduler_wait_ms, n)
    prefill = 5 + (inp - cached) * 0.02
    tpot = rng.uniform(8, 25, n)
    decode = (out - 1) * tpot
    detok = rng.uniform(0.2, 1.0, n)
    ttft = tq + tok + ipc + sw + prefill
    e2e = ttft + decode + detok
    ms = 1e-3
    frame = pd.DataFrame(
        {
            "rid": [f"r{i}" for i in range(n)],
            "status": "completed",
            "reason": "",
            "arrival": arrival,
            "tokenize_start": arrival + tq * ms,
            "tokenized": arrival + (tq + tok) * ms,
            "sched_arrival": arrival + (tq + tok + ipc) * ms,
            "first_scheduled": arrival + (tq + tok + ipc + sw) * ms,
            "first_token": arrival + ttft * ms,
            "finished": arrival + e2e * ms,
            "input_tokens": inp,
            "output_tokens": out,
            "cached_tokens": cached,
            "num_preemptions": 0,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": e2e,
            "tokenizer_queue_ms": tq,
            "tokenize_ms": tok,
            "ipc_ms": ipc,
            "scheduler_wait_ms": sw,
            "prefill_ms": prefill,
            "decode_ms": decode,
            "detokenize_ms": detok,
        }
    )
    if s.rejected:
        rejected = frame.iloc[: s.rejected].copy()
        rejected["rid"] = [f"x{i}" for i in range(s.rejected)]
        rejected["status"], rejected["reason"] = "rejected", "too_long"
        timing = [c for c in frame.columns if c.endswith("_ms") or c in ("tokenize_start",)]
        timing += ["arrival", "tokenized", "sched_arrival", "first_scheduled"]
        timing += ["first_token", "finished"]
        rejected[timing] = np.nan
        frame = pd.concat([frame, rejected], ignore_index=True)
    return frame


def _steps(s: Scenario, rng: np.random.Generator) -> pd.DataFrame:
    n = s.num_steps
    spacing = s.duration_s / n
    time = np.arange(n) * spacing
    reasons = np.array(["", *s.blocked], dtype=object)
    probs = np.array([1 - sum(s.blocked.values()), *s.blocked.values()])
    blocked = reasons[rng.choice(len(reasons), n, p=probs)]
    waiting = (rng.random(n) < s.waiting_fraction) | (blocked != "")
    at_cap = waiting & (rng.random(n) < s.running_at_cap_fraction)
    if s.running_cap_at_cap:
        at_cap |= blocked == "running_cap"
    running = np.where(at_cap, MAX_RUNNING, rng.integers(1, MAX_RUNNING, n))
    prefill = np.where(rng.random(n) < 0.2, rng.integers(64, 2048, n), 0)
    kv = np.clip(rng.normal(s.kv_utilization, 0.03, n), 0, 1) * NUM_PAGES
    prompt = np.cumsum(prefill * 1.5).astype(np.int64)
    return pd.DataFrame(
        {
            "step": np.arange(n),
            "time": time,
            "duration_s": spacing * np.clip(rng.normal(s.busy, 0.02, n), 0, 1),
            "batch_size": running,
            "prefill_tokens": prefill,
            "decode_requests": np.maximum(running - (prefill > 0), 0),
            "context_tokens": running * rng.integers(200, 3000, n),
            "kv_pages_used": kv.astype(int),
            "kv_pages_total": NUM_PAGES,
            "num_waiting": np.where(waiting, rng.integers(1, 50, n), 0),
            "num_running": running,
            "preempted": (rng.random(n) < s.preempt_fraction).astype(int),
            "blocked": blocked,
            "cached_tokens": (prompt * 0.3).astype(np.int64),
            "prompt_tokens": prompt,
        }
    )


def _queues(s: Scenario, steps: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    frames = []
    for stage, mean in (("tokenizer", s.tokenizer_queue_ms / 5), ("detokenizer", 0.2)):
        t = np.sort(rng.uniform(0, s.duration_s, 500))
        frames.append(
            pd.DataFrame({"time": t, "stage": stage, "queue_len": rng.poisson(mean, 500)})
        )
    frames.append(
        pd.DataFrame(
            {"time": steps["time"], "stage": "scheduler", "queue_len": steps["num_waiting"]}
        )
    )
    return pd.concat(frames, ignore_index=True).sort_values("time", kind="stable")


def synthetic_run(s: Scenario) -> Run:
    rng = np.random.default_rng(s.seed)
    requests = _requests(s, rng)
    steps = _steps(s, rng)
    queues = _queues(s, steps, rng)
    done = requests[requests["status"] == "completed"]
    itl = rng.gamma(4.0, 4e-3, int(done["output_tokens"].sum()))

    def pcts(v: np.ndarray) -> dict[str, float]:
        return {
            "mean": float(np.mean(v)),
            **{f"p{p}": float(np.percentile(v, p)) for p in (50, 90, 99)},
        }

    summary = {
        "num_requests": len(requests),
        "completed": len(done),
        "rejected": s.rejected,
        "duration_s": s.duration_s,
        "request_throughput": len(done) / s.duration_s,
        "output_throughput": float(done["output_tokens"].sum()) / s.duration_s,
        "input_throughput": float(done["input_tokens"].sum()) / s.duration_s,
        "goodput": {"value": 1.0, "slo_ttft_ms": 200.0, "slo_tpot_ms": 20.0},
        "prefix_hit_rate": 0.3,
        "ttft_ms": pcts(done["ttft_ms"].to_numpy()),
        "tpot_ms": pcts(done["tpot_ms"].to_numpy()),
        "itl_ms": pcts(itl * 1e3),
        "e2e_ms": pcts(done["e2e_ms"].to_numpy()),
        "config": {
            "policy": "fcfs",
            "tp": 1,
            "num_tokenizers": 2,
            "max_running": MAX_RUNNING,
            "max_prefill_tokens": 8192,
            "num_pages": NUM_PAGES,
            "page_size": 16,
            "model": "llama-3-8b",
            "hardware": "h200",
        },
        "cost_model": {"name": "roofline", "profile": None, "provenance": "H200 ceilings"},
        "wall_s": 1.5,
        "num_steps": s.num_steps,
        "trace": {"path": "traces/synthetic.jsonl", "format": "jsonl", "limit": None},
    }
    return Run(summary, requests, steps, queues, itl)


def test_synthetic_run_keeps_the_contract() -> None:
    run = synthetic_run(Scenario(rejected=5))
    done = run.requests[run.requests["status"] == "completed"]
    stages = ["tokenizer_queue_ms", "tokenize_ms", "ipc_ms", "scheduler_wait_ms", "prefill_ms"]
    np.testing.assert_allclose(done[stages].sum(axis=1), done["ttft_ms"])
    np.testing.assert_allclose((done["first_token"] - done["arrival"]) * 1e3, done["ttft_ms"])
    assert run.requests["arrival"].isna().sum() == 5
    assert (np.diff(run.steps["prompt_tokens"]) >= 0).all()


def test_binning_matches_a_direct_computation() -> None:
    rng = np.random.default_rng(1)
    t = rng.uniform(0, 10, 5000)
    v = rng.normal(size=5000)
    bins = binning.TimeBins(0.0, 10.0, 37)
    which = np.minimum((t / bins.width).astype(int), 36)
    for b in range(37):
        sel = which == b
        assert binning.bin_count(bins, t)[b] == sel.sum()
        assert np.isclose(binning.bin_sum(bins, t, v)[b], v[sel].sum())
        assert np.isclose(binning.bin_mean(bins, t, v)[b], v[sel].mean())
        assert np.isclose(binning.bin_max(bins, t, v)[b], v[sel].max())


def test_step_function_and_counters_carry_values_across_empty_bins() -> None:
    bins = binning.TimeBins(0.0, 10.0, 10)
    t = np.array([0.5, 0.7, 4.2])
    v = np.array([3.0, 1.0, 7.0])
    peak = binning.step_function_max(bins, t, v)
    np.testing.assert_array_equal(peak, [3, 1, 1, 1, 7, 7, 7, 7, 7, 7])
    cum = binning.last_value_at_edges(bins, t, np.array([10.0, 20.0, 50.0]))
    np.testing.assert_array_equal(cum, [0, 20, 20, 20, 20, 50, 50, 50, 50, 50, 50])


def test_step_function_mean_weights_values_by_how_long_they_hold() -> None:
    bins = binning.TimeBins(0.0, 4.0, 2)
    t = np.array([0.0, 1.0, 1.0, 3.0])
    v = np.array([2.0, 9.0, 4.0, 0.0])
    np.testing.assert_allclose(binning.step_function_mean(bins, t, v), [3.0, 2.0])
