"""Property tests of the host KV tier in the scheduler core.

Random workloads (``tier_workload``) run with the core's invariants checked
after every call (no page both free and referenced, both tiers' capacities,
the residency rules) and every plan executed on a model of the KV content in
the order the engine promises (writes, loads, compute): a read of a page whose
load had not come first, or of a page reused before its write-back, reads the
wrong token.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tier_workload import plans_digest, run_workload, tokens_of

from core.scheduler import Plan, Request, Scheduler, SchedulerConfig
from core.scheduler.invariants import check_invariants
from core.scheduler.options import add_scheduler_flags, scheduler_config

PAGE = 4
BOUNDED = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tier_config(
    num_pages: int, host_pages: int, tier_policy: str = "write_back", policy: str = "fcfs"
) -> SchedulerConfig:
    return SchedulerConfig(
        num_pages=num_pages,
        page_size=PAGE,
        max_running=6,
        max_prefill_tokens=24,
        policy=policy,
        host_kv_pages=host_pages,
        host_kv_policy=tier_policy,
    )


def drain(s: Scheduler) -> None:
    """Abort everything and step until idle: every page and slot must come back."""
    for rid in list(s.requests):
        s.abort(rid)
    while s.has_work():
        s.complete(s.schedule(0.0), {})
    check_invariants(s)
    cache = s.memory.cache
    assert cache is not None
    assert all(node.ref == 0 for node in cache.nodes())
    assert s.memory.num_free + cache.evictable_pages == s.config.pages


@BOUNDED
@given(
    seed=st.integers(0, 10_000),
    num_pages=st.integers(12, 20),
    host_pages=st.integers(1, 40),
    tier_policy=st.sampled_from(["write_back", "write_through"]),
    overlap=st.booleans(),
    policy=st.sampled_from(["fcfs", "lpm"]),
)
def test_random_workloads_keep_invariants_and_kv_content(
    seed: int, num_pages: int, host_pages: int, tier_policy: str, overlap: bool, policy: str
) -> None:
    config = tier_config(num_pages, host_pages, tier_policy, policy)
    _, s = run_workload(config, seed, steps=120, overlap=overlap, content=True, checked=True)
    drain(s)


def test_workloads_exercise_loads_writes_and_preemption() -> None:
    """The random workloads do reach the cases the properties are about."""
    plans, s = run_workload(tier_config(12, 16), 1, steps=300, content=True, checked=True)
    assert any(p.loads for p in plans) and any(p.writes for p in plans)
    assert any(p.preempted for p in plans)
    stats = s.stats()
    assert stats.host_hit_tokens == stats.host_loaded_tokens > 0
    assert stats.host_written_tokens > 0
    assert stats.host_pages_used <= stats.host_pages == 16


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_and_preemption_mid_load_release_everything(overlap: bool) -> None:
    """Requests aborted (or preempted) while their loads are in flight give back every page."""
    aborted = 0
    for seed in range(20):
        _, s = run_workload(tier_config(12, 24), seed, steps=120, overlap=overlap, checked=True)
        plan = s.schedule(1e9)
        if plan.loads:
            rids = [c.rid for c in plan.prefill]
            for rid in rids:
                aborted += s.abort(rid)
            check_invariants(s)
        s.complete(plan, tokens_of(plan, lambda rid, p: 0))
        drain(s)
    assert aborted > 0


def test_host_only_prefix_is_loaded_then_read() -> None:
    """A prompt evicted to the host comes back by loads in the plan that first reads it."""
    s = Scheduler(tier_config(6, 8))
    prompt_a, prompt_b = list(range(17)), [9] * 17

    def run(rid: str, prompt: list[int]) -> list[Plan]:
        s.add(Request(rid, len(prompt), 1, prompt=prompt))
        plans = []
        while s.has_work():
            plan = s.schedule(0.0)
            plans.append(plan)
            s.complete(plan, {c.rid: 0 for c in plan.prefill if c.samples})
            check_invariants(s)
        return plans

    run("a", prompt_a)
    evicting = run("b", prompt_b)  # needs the device pages "a" left in the cache
    assert [w for p in evicting for w in p.writes]
    again = run("a2", prompt_a)
    first = again[0]
    assert len(first.loads) == 4  # 16 of 17 tokens: the last one is computed for its logits
    assert {page for _, page in first.loads} == set(first.prefill[0].pages[:4])
    assert first.prefill[0].start == 16
    assert s.stats().host_hit_tokens == 16


GOLDEN = [  # digests of the plans of the scheduler as it was before the host tier existed
    (12, False, "fcfs", 0, "59ab3c811dec01fa"),
    (12, False, "fcfs", 1, "7c08962060a2b9ee"),
    (12, True, "lpm", 0, "2dc6d8168419d9fc"),
    (12, True, "lpm", 2, "a5461c36641394e0"),
    (30, False, "lpm", 1, "b149ff2a63249ece"),
    (14, True, "fcfs", 2, "81a92c604851f39e"),
]


@pytest.mark.parametrize(("num_pages", "overlap", "policy", "seed", "digest"), GOLDEN)
def test_tier_off_plans_equal_todays(
    num_pages: int, overlap: bool, policy: str, seed: int, digest: str
) -> None:
    config = SchedulerConfig(
        num_pages=num_pages, page_size=PAGE, max_running=6, max_prefill_tokens=24, policy=policy
    )
    plans, _ = run_workload(config, seed, steps=300, overlap=overlap)
    assert not any(p.has_copies for p in plans)
    assert plans_digest(plans) == digest


def one_at_a_time(config: SchedulerConfig, prompts: list[list[int]]) -> Scheduler:
    s = Scheduler(config)
    for i, prompt in enumerate(prompts):
        s.add(Request(f"r{i}", len(prompt), 2, prompt=prompt))
        while s.has_work():
            plan = s.schedule(0.0)
            s.complete(plan, tokens_of(plan, lambda rid, p: 1))
        check_invariants(s)
    return s


@BOUNDED
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.lists(st.integers(0, 3), max_size=9)),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from(["write_back", "write_through"]),
)
def test_a_roomy_tier_hits_like_an_unlimited_device(
    requests: list[tuple[int, list[int]]], policy: str
) -> None:
    bases = [[b] * (4 * PAGE + b) for b in range(6)]
    prompts = [bases[b] + tail for b, tail in requests]
    unlimited = one_at_a_time(SchedulerConfig(num_pages=4096, page_size=PAGE), prompts)
    small = SchedulerConfig(num_pages=10, page_size=PAGE)
    tiered = one_at_a_time(replace(small, host_kv_pages=4096, host_kv_policy=policy), prompts)
    assert tiered.cached_tokens == unlimited.cached_tokens
    untiered = one_at_a_time(small, prompts)
    assert untiered.cached_tokens <= tiered.cached_tokens


def test_plan_copies_round_trip() -> None:
    plan = Plan(step=3, writes=((1, 2), (4, 0)), loads=((2, 5),))
    assert Plan.from_dict(plan.to_dict()) == plan
    assert plan.has_copies and not Plan(step=1).has_copies


def test_settings_and_flags() -> None:
    parser = argparse.ArgumentParser()
    add_scheduler_flags(parser)
    args = parser.parse_args(["--host-kv-gb", "2", "--host-kv-policy", "write_through"])
    config = scheduler_config(args)
    assert (config.host_kv_gb, config.host_kv_policy) == (2.0, "write_through")
    with pytest.raises(ValueError, match="sized"):
        _ = config.host_pages
    assert config.sized_host_tier(1_000_000).host_pages == 2000
    assert SchedulerConfig().sized_host_tier(1).host_pages == 0
    with pytest.raises(ValueError, match="host_kv_policy"):
        SchedulerConfig(host_kv_policy="off")
    with pytest.raises(ValueError, match=">= 0"):
        SchedulerConfig(host_kv_gb=-1)
    no_cache = SchedulerConfig(num_pages=8, host_kv_pages=4, prefix_cache=False)
    assert Scheduler(no_cache).memory.tier is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--host-kv-policy", "sometimes"])
