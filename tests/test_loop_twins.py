"""The engine's scheduler loop and the simulator's twin make the same calls to the core.

``StepDriver.advance`` (what ``engine.scheduler_proc.loop.SchedulerLoop`` runs
each iteration) and ``sim.model.scheduler_loop.SimSchedulerLoop`` both drive a
``Scheduler``; the order of ``schedule`` and ``complete``, strict or
overlapped, is written in each. A difference would be a scheduling divergence
that no cost model can fix, so both are fed the same requests and their core
calls compared one by one: the same plans (pages included), completed in the
same order, with the same events.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from core.scheduler import Plan, Scheduler, SchedulerConfig
from engine.ipc.messages import TokenizedRequest
from engine.runner.inputs import StepInputs
from engine.runner.step import StepHandle
from engine.sampling.params import SamplingParams
from engine.scheduler_proc.driver import Launched, StepDriver
from schema.traces import TraceRequest
from sim.costs import CostSpec, make_cost_model
from sim.costs.base import CpuCosts
from sim.model.calls import Call, RecordingScheduler
from sim.model.loop_settings import LoopSettings
from sim.model.pipeline import Pipeline

TOKEN = 7  # what the stand-in model samples: never a stop token (the driver has no EOS ids)
ZERO_CPU = CpuCosts(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, "test", "all CPU stages free")

# (prompt tokens, output tokens): chunked prompts, short and long outputs
REQUESTS = [(40, 6), (70, 3), (20, 12), (33, 1), (90, 5), (16, 9), (48, 4)]


def sampled_tokens(plan: Plan, inputs: StepInputs) -> StepHandle:
    """The model as the loop sees it: one token per sampling row of the plan."""
    return StepHandle(torch.full((len(plan.sampling_rids()),), TOKEN, dtype=torch.int64))


def engine_calls(config: SchedulerConfig, overlap: bool) -> list[Call]:
    driver = StepDriver(config, sampled_tokens, eos_token_ids=[])
    recorder = RecordingScheduler(driver.core)
    driver.core = recorder  # type: ignore[assignment]
    for i, (prompt, output) in enumerate(REQUESTS):
        params = SamplingParams(max_new_tokens=output, ignore_eos=True)
        ids = [100 + i] * prompt  # no two prompts share a page
        driver.add(TokenizedRequest(f"r{i}", ids, params, received=0.0, tokenized=0.0))
    in_flight: Launched | None = None
    while driver.has_work() or in_flight is not None:
        _, in_flight, _ = driver.advance(in_flight, overlap)
    return recorder.calls


def sim_calls(config: SchedulerConfig, overlap: bool) -> list[Call]:
    trace = [TraceRequest(f"r{i}", 0.0, p, o) for i, (p, o) in enumerate(REQUESTS)]
    recorder = RecordingScheduler(Scheduler(config))
    gpu = make_cost_model("roofline", CostSpec("smollm2-135m", "h200", 1, "bf16", "bf16"))
    settings = LoopSettings(overlap=overlap, fast_forward=False)
    Pipeline(trace, recorder, gpu, ZERO_CPU, loop=settings).run()
    return recorder.calls


def comparable(call: Call) -> tuple[Any, ...]:
    """A call without what only one world has: the clock, the tokens' values."""
    if call.name == "add":
        return ("add", call.args[0]["rid"], call.args[0]["prompt_len"], call.result)
    if call.name == "schedule":
        return ("schedule", call.result)
    if call.name == "complete":
        return ("complete", call.args, tuple((type(e).__name__, e.rid) for e in call.result))
    raise AssertionError(f"unexpected call {call.name}")


@pytest.mark.parametrize("overlap", [False, True], ids=["strict", "overlap"])
@pytest.mark.parametrize("num_pages", [64, 9], ids=["roomy", "preempting"])
def test_engine_and_simulator_loops_make_the_same_core_calls(overlap: bool, num_pages: int) -> None:
    config = SchedulerConfig(
        num_pages=num_pages, page_size=16, max_running=4, max_prefill_tokens=64, prefix_cache=False
    )
    engine = [comparable(c) for c in engine_calls(config, overlap)]
    sim = [comparable(c) for c in sim_calls(config, overlap)]
    assert sum(c[0] == "schedule" for c in engine) > len(REQUESTS)
    preempted = sum(str(c).count("Preempted") for c in engine)
    assert (preempted > 0) == (num_pages == 9)  # 9 pages of 16 tokens: decode must preempt
    for i, (e, s) in enumerate(zip(engine, sim, strict=False)):
        assert e == s, f"call {i} differs:\nengine {e}\nsim    {s}"
    assert len(engine) == len(sim)


def test_the_comparison_sees_a_different_order() -> None:
    """Completing a step before scheduling the next (strict) is not the overlapped order."""
    config = SchedulerConfig(num_pages=64, max_running=4, max_prefill_tokens=64, prefix_cache=False)
    strict = [comparable(c) for c in engine_calls(config, overlap=False)]
    overlapped = [comparable(c) for c in sim_calls(config, overlap=True)]
    assert strict != overlapped
