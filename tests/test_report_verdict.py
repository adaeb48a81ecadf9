"""The bottleneck verdict names the limit that the data shows, by its documented rules."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest
from test_report_synth import Scenario, synthetic_run

from lab.report import bottleneck_verdict
from lab.report.verdict import (
    GPU_BUSY_FRACTION,
    LIMIT_LABELS,
    LIMIT_STEP_FRACTION,
    QUEUE_TAIL_MS,
    TOKENIZER_BUSY_FRACTION,
    TOKENIZER_TTFT_SHARE,
    WAITING_STEP_FRACTION,
)


def loaded(**changes: Any) -> Scenario:
    """A busy run with requests waiting at most steps."""
    base = Scenario(busy=0.96, waiting_fraction=0.6, scheduler_wait_ms=300.0)
    return replace(base, **changes)


CASES = {
    "kv_memory": loaded(blocked={"kv_memory": 0.3}, kv_utilization=0.97, preempt_fraction=0.02),
    "running_cap": loaded(blocked={"running_cap": 0.2}, running_at_cap_fraction=0.5),
    "prefill_budget": loaded(blocked={"prefill_budget": 0.35}),
    "tokenizer": Scenario(
        busy=0.6, tokenizer_queue_ms=400.0, tokenize_ms_per_token=0.15, scheduler_wait_ms=3.0
    ),
    "gpu_compute": loaded(blocked={"prefill_budget": 0.03}),
    "none": Scenario(),
}


def verdict_of(s: Scenario) -> dict[str, Any]:
    run = synthetic_run(s)
    return bottleneck_verdict(run.summary, run.requests, run.steps, run.queues)


@pytest.mark.parametrize("limit", list(CASES))
def test_verdict_names_the_binding_limit(limit: str) -> None:
    verdict = verdict_of(CASES[limit])
    assert verdict["binding_limit"] == limit
    json.dumps(verdict, allow_nan=False)


def test_each_admission_limit_stops_binding_below_its_threshold() -> None:
    below = LIMIT_STEP_FRACTION / 2
    for reason in ("kv_memory", "running_cap", "prefill_budget"):
        s = Scenario(busy=0.5, waiting_fraction=0.05, blocked={reason: below})
        verdict = verdict_of(s)
        assert verdict["limit_scores"][reason] == pytest.approx(below, abs=0.02)
        assert verdict["binding_limit"] == "none"


def test_the_admission_limit_with_most_blocked_steps_wins() -> None:
    s = loaded(blocked={"kv_memory": 0.15, "running_cap": 0.3})
    assert verdict_of(s)["binding_limit"] == "running_cap"
    s = loaded(blocked={"kv_memory": 0.3, "running_cap": 0.15})
    assert verdict_of(s)["binding_limit"] == "kv_memory"


def test_preemptions_alone_point_at_kv_memory() -> None:
    s = Scenario(busy=0.7, waiting_fraction=0.2, preempt_fraction=2 * LIMIT_STEP_FRACTION)
    verdict = verdict_of(s)
    assert verdict["binding_limit"] == "kv_memory"
    assert verdict["evidence"]["preemptions"] > 0


def test_running_at_cap_with_waiting_requests_points_at_the_cap() -> None:
    s = Scenario(busy=0.7, waiting_fraction=0.6, running_at_cap_fraction=0.5)
    verdict = verdict_of(s)
    assert verdict["binding_limit"] == "running_cap"
    assert verdict["evidence"]["running_at_cap_fraction"] > LIMIT_STEP_FRACTION


def test_gpu_compute_needs_both_a_busy_engine_and_waiting_requests() -> None:
    idle_queue = Scenario(busy=0.97, waiting_fraction=WAITING_STEP_FRACTION / 3)
    assert verdict_of(idle_queue)["binding_limit"] == "none"
    not_busy = Scenario(busy=GPU_BUSY_FRACTION - 0.2, waiting_fraction=0.6)
    assert verdict_of(not_busy)["binding_limit"] == "none"


def test_tokenizer_binds_only_when_its_queue_outweighs_the_scheduler_wait() -> None:
    s = loaded(scheduler_wait_ms=500.0, tokenizer_queue_ms=350.0)
    verdict = verdict_of(s)
    assert verdict["evidence"]["tokenizer_queue_share_of_ttft"] >= TOKENIZER_TTFT_SHARE
    assert verdict["binding_limit"] == "gpu_compute"


def test_a_tokenizer_queue_with_idle_workers_is_held_back_by_the_engine() -> None:
    busy = verdict_of(CASES["tokenizer"])
    assert busy["evidence"]["tokenizer_busy_fraction"] >= TOKENIZER_BUSY_FRACTION
    assert "more workers raise throughput" in busy["text"]
    # the same queue, but the workers tokenize each prompt 75 times faster: they idle
    held = verdict_of(replace(CASES["tokenizer"], tokenize_ms_per_token=0.002))
    assert held["evidence"]["tokenizer_busy_fraction"] < TOKENIZER_BUSY_FRACTION
    assert held["evidence"]["tokenizer_queue_share_of_ttft"] >= TOKENIZER_TTFT_SHARE
    assert held["binding_limit"] == "gpu_compute"
    assert "more tokenizer workers would not help" in held["text"]


def test_dominant_stages_follow_the_stage_times() -> None:
    verdict = verdict_of(CASES["kv_memory"])
    assert verdict["dominant_stage"] == "decode"
    assert verdict["dominant_ttft_stage"] == "scheduler_wait"
    assert verdict_of(CASES["tokenizer"])["dominant_ttft_stage"] == "tokenizer_queue"
    assert verdict_of(CASES["none"])["dominant_ttft_stage"] == "prefill"


def test_stage_shares_are_ratios_of_means_over_completed_requests() -> None:
    run = synthetic_run(Scenario(rejected=7))
    verdict = bottleneck_verdict(run.summary, run.requests, run.steps, run.queues)
    done = run.requests[run.requests["status"] == "completed"]
    decode_without_detok = (done["decode_ms"] - done["detokenize_ms"]).clip(lower=0)
    assert verdict["stage_shares"]["decode"] == pytest.approx(
        decode_without_detok.mean() / done["e2e_ms"].mean()
    )
    assert verdict["ttft_stage_shares"]["prefill"] == pytest.approx(
        done["prefill_ms"].mean() / done["ttft_ms"].mean()
    )
    assert verdict["evidence"]["rejected_fraction"] == pytest.approx(7 / len(run.requests))


def test_text_quotes_the_figures_it_rests_on() -> None:
    verdict = verdict_of(CASES["kv_memory"])
    ev = verdict["evidence"]
    assert f"{100 * ev['blocked_fraction']['kv_memory']:.0f}% of steps" in verdict["text"]
    assert f"{ev['preemptions']:.0f} preemptions" in verdict["text"]
    assert f"{100 * verdict['stage_shares']['decode']:.0f}%" in verdict["text"]


def test_busy_fraction_is_step_time_over_run_duration() -> None:
    run = synthetic_run(CASES["gpu_compute"])
    verdict = bottleneck_verdict(run.summary, run.requests, run.steps, run.queues)
    expected = run.steps["duration_s"].sum() / run.summary["duration_s"]
    assert verdict["evidence"]["busy_fraction"] == pytest.approx(expected)


def test_csv_round_trip_and_a_bare_summary_give_the_same_limit() -> None:
    run = synthetic_run(CASES["prefill_budget"])
    buf = io.StringIO()
    run.steps.to_csv(buf, index=False)
    buf.seek(0)
    steps = pd.read_csv(buf)
    assert steps["blocked"].isna().any()
    bare = {"duration_s": run.summary["duration_s"]}
    verdict = bottleneck_verdict(bare, run.requests, steps, run.queues)
    assert verdict["binding_limit"] == "prefill_budget"
    categorical = steps.assign(blocked=pd.Categorical(steps["blocked"]))
    again = bottleneck_verdict(bare, run.requests, categorical, run.queues)
    assert again["limit_scores"] == verdict["limit_scores"]
    assert verdict["limit_scores"]["prefill_budget"] == pytest.approx(
        (run.steps["blocked"] == "prefill_budget").mean()
    )


def test_empty_run_is_underloaded_and_serializable() -> None:
    empty = pd.DataFrame()
    verdict = bottleneck_verdict({}, empty, empty, empty)
    assert verdict["binding_limit"] == "none"
    assert verdict["dominant_stage"] is None
    json.dumps(verdict, allow_nan=False)


def test_running_cap_labels_below_the_cap_do_not_count() -> None:
    s = loaded(
        blocked={"running_cap": 0.7, "kv_memory": 0.15},
        running_cap_at_cap=False,
        kv_utilization=0.96,
    )
    verdict = verdict_of(s)
    ev = verdict["evidence"]
    assert ev["blocked_fraction"]["running_cap"] == pytest.approx(0.7, abs=0.03)
    assert ev["running_cap_below_cap_fraction"] == pytest.approx(0.7, abs=0.03)
    assert verdict["binding_limit"] == "kv_memory"


def test_a_queued_tail_is_not_called_underloaded() -> None:
    """An ``engine bench`` whose step record shows no waiting, yet requests wait seconds
    before their prefill: the TTFT tail names queueing, with the figures."""
    run = synthetic_run(Scenario(busy=0.6, waiting_fraction=0.0, scheduler_wait_ms=3_000.0))
    verdict = bottleneck_verdict(run.summary, run.requests, run.steps, run.queues)
    ev = verdict["evidence"]
    assert verdict["binding_limit"] == "queueing"
    assert "underloaded" not in verdict["limit_label"] + verdict["text"]
    assert ev["queue_delay_p99_ms"] >= QUEUE_TAIL_MS
    assert f"TTFT P99 {ev['ttft_p99_ms'] / 1e3:,.1f} s" in verdict["text"]
    no_steps = bottleneck_verdict({}, run.requests, pd.DataFrame(), pd.DataFrame())
    assert no_steps["binding_limit"] == "queueing"
    json.dumps(verdict, allow_nan=False)


def test_long_prompts_alone_are_not_queueing() -> None:
    """A TTFT tail of seconds made by slow prefills of long prompts (a CPU engine) is the
    prompts' own prefill, not a queue: the run stays unbound."""
    run = synthetic_run(Scenario())
    slow = 50 * run.requests["prefill_ms"]
    requests = run.requests.assign(
        ttft_ms=run.requests["ttft_ms"] + slow - run.requests["prefill_ms"], prefill_ms=slow
    )
    verdict = bottleneck_verdict(run.summary, requests, run.steps, run.queues)
    assert verdict["evidence"]["ttft_p99_ms"] > 3_000
    assert verdict["evidence"]["queue_delay_p99_ms"] < QUEUE_TAIL_MS
    assert verdict["binding_limit"] == "none"
    assert verdict["limit_label"] == LIMIT_LABELS["none"]
