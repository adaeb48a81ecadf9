"""The simulator's host KV tier: the core's counts, the hit rate it buys, the time its copies cost.

A small trace revisits more prompt prefixes than the device's KV pages hold,
one request at a time (arrivals far apart), so the LRU device cache alone
never hits and a host tier with room hits every revisit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.scheduler import Request, Scheduler
from lab.cli.sim import main
from schema.traces import Trace, TraceRequest
from sim.config import SimConfig, build_config
from sim.replay import ReplayResult, run_replay

DOCS, BLOCKS, ROUNDS = 6, 4, 3  # 6 prompts of 4 blocks of 512 tokens, each seen 3 times
DEVICE_PAGES = 400  # 128 pages a prompt (page 16): the device holds 3 of the 6


def revisiting_trace() -> Trace:
    requests = []
    for i in range(DOCS * ROUNDS):
        doc = i % DOCS
        hashes = tuple(doc * 100 + b for b in range(BLOCKS))
        requests.append(TraceRequest(f"r{i}", 2.0 * i, BLOCKS * 512 + 7, 4, hashes))
    return Trace("revisits", "jsonl", requests)


def replay(model: str = "qwen3-0.6b", **settings: Any) -> ReplayResult:
    config = build_config(None, model=model, cost_model="roofline", **settings)
    return run_replay(revisiting_trace(), config, progress=False)


def core_one_at_a_time(config: SimConfig) -> Scheduler:
    """The trace's requests through the core alone, each run to its end before the next."""
    s = Scheduler(config.scheduler_config())
    for t in revisiting_trace().requests:
        s.add(Request(t.rid, t.input_length, t.output_length, block_hashes=t.hash_ids))
        while s.has_work():
            s.complete(s.schedule(0.0), None)
    return s


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_the_tier_hits_like_an_unlimited_cache_and_matches_the_core(policy: str) -> None:
    tiered = replay(num_pages=DEVICE_PAGES, host_kv_gb=2.0, host_kv_policy=policy)
    untiered = replay(num_pages=DEVICE_PAGES)
    unlimited = replay(num_pages=20_000)
    assert untiered.summary["prefix_hit_rate"] < tiered.summary["prefix_hit_rate"]
    assert tiered.summary["prefix_hit_rate"] == pytest.approx(unlimited.summary["prefix_hit_rate"])

    host = tiered.summary["host_kv"]
    core = core_one_at_a_time(tiered_config(policy)).stats()
    assert host["host_hit_tokens"] == core.host_hit_tokens > 0
    assert host["host_loaded_tokens"] == core.host_loaded_tokens == core.host_hit_tokens
    assert host["host_written_tokens"] == core.host_written_tokens > 0
    assert untiered.summary["host_kv"] == {"enabled": False}


def tiered_config(policy: str) -> SimConfig:
    return build_config(
        None, model="qwen3-0.6b", num_pages=DEVICE_PAGES, host_kv_gb=2.0, host_kv_policy=policy
    )


@pytest.mark.parametrize("overlap", [False, True])
def test_loads_cost_time(overlap: bool) -> None:
    """A revisit's TTFT: no load (unlimited device) < a load from the host < recompute, for
    Llama-3.1-8B; for Qwen3-0.6B, whose prefill is cheap, the copies cost more than it."""
    settings: dict[str, dict[str, Any]] = {
        "unlimited": {"num_pages": 20_000},
        "tiered": {"num_pages": DEVICE_PAGES, "host_kv_gb": 2.0},
        "untiered": {"num_pages": DEVICE_PAGES},
    }
    ttft = {
        name: replay("llama-3.1-8b", overlap=overlap, **kw).requests["ttft_ms"].iloc[DOCS:].mean()
        for name, kw in settings.items()
    }
    assert ttft["unlimited"] < ttft["tiered"] < ttft["untiered"]
    small = replay(overlap=overlap, num_pages=DEVICE_PAGES, host_kv_gb=2.0).requests["ttft_ms"]
    recompute = replay(overlap=overlap, num_pages=DEVICE_PAGES).requests["ttft_ms"]
    assert small.iloc[DOCS:].mean() > recompute.iloc[DOCS:].mean()


def test_the_host_does_not_wait_for_a_step_s_copies() -> None:
    """Overlapped, a step's loads run on the side stream while the step in flight ends: the
    host completes that step and schedules the next before the loads are done (the engine
    queues the copies without waiting for them), and the step's compute waits for both."""
    first = revisiting_trace().requests[:DOCS]  # each prompt once: the device evicts to the host
    again = [
        TraceRequest(f"again{i}", 20.0 + 0.05 * i, BLOCKS * 512 + 7, 64, r.hash_ids)
        for i, r in enumerate(first)
    ]  # the prompts again, each arriving while the one before decodes
    config = build_config(None, model="llama-3.1-8b", cost_model="roofline", overlap=True,
                          num_pages=DEVICE_PAGES, host_kv_gb=2.0)  # fmt: skip
    result = run_replay(Trace("again", "jsonl", [*first, *again]), config, progress=False,
                        record_steps=True)  # fmt: skip
    assert result.summary["host_kv"]["host_loaded_tokens"] > 0
    steps = result.engine_steps
    assert steps is not None
    compute_start = (steps["done"] - steps["device_ms"] / 1e3).to_numpy()
    scheduled_next = steps["schedule_start"].to_numpy()[1:]
    ahead = scheduled_next < compute_start[:-1] - 1e-6  # the host moved on during the copies
    assert ahead.any()
    done = steps["done"].to_numpy()
    assert (scheduled_next[1:] >= done[:-2] - 1e-9).all()  # but after the step in flight ended


def test_sizing_and_copy_costs() -> None:
    config = tiered_config("write_back")
    page_bytes = 16 * config.kv_bytes_per_token_per_gpu()
    assert config.scheduler_config().host_pages == int(2e9 // page_bytes)
    costs = replay(num_pages=DEVICE_PAGES, host_kv_gb=2.0).summary["host_kv"]["copy_costs"]
    assert costs["load_per_token_s"] == pytest.approx(config.kv_bytes_per_token_per_gpu() / 55.5e9)
    assert "h200" in costs["source"]


def test_sim_replay_flags(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps(
                {
                    "timestamp": 1000 * r.arrival,
                    "input_length": r.input_length,
                    "output_length": r.output_length,
                    "hash_ids": list(r.hash_ids),
                }
            )
            for r in revisiting_trace().requests
        )
    )
    out = tmp_path / "out"
    rc = main(["replay", str(trace), "--model", "qwen3-0.6b", "--num-pages", str(DEVICE_PAGES),
               "--host-kv-gb", "2", "--host-kv-policy", "write_through", "--no-progress",
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["host_kv"]["host_hit_tokens"] > 0
    assert summary["config"]["host_kv_policy"] == "write_through"
