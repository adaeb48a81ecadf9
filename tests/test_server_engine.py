"""The scheduler process's engine (core + runner + request store) in-process, without sockets."""

from __future__ import annotations

from typing import Any

import pytest

from core.scheduler import SchedulerConfig
from engine.ipc import messages
from engine.runner.args import RunnerArgs
from engine.runner.tp import TPLeader
from engine.sampling.params import SamplingParams
from engine.scheduler_proc.driver import StepDriver

PROMPTS = [[1, 504, 3458, 282], [1, 9690, 198, 2683, 359, 253], [1, 2, 3, 4, 5, 6, 7, 8, 9]]


@pytest.fixture(scope="module")
def leader(model_ready: str) -> Any:
    lead = TPLeader(
        RunnerArgs(
            model=model_ready,
            scheduler=SchedulerConfig(num_pages=64),
            dtype="float32",
            cpu_threads=2,
        )
    )
    yield lead
    lead.shutdown()


def make_engine(leader: Any, num_pages: int = 64) -> StepDriver:
    config = SchedulerConfig(num_pages=num_pages, page_size=leader.runner.page_size)
    return StepDriver(config, leader.launch, leader.runner.eos_token_ids)


def request(rid: str, prompt: list[int], max_new: int = 12, **kw: Any) -> messages.TokenizedRequest:
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True, **kw)
    return messages.TokenizedRequest(
        rid=rid, input_ids=prompt, sampling=params, received=0.0, tokenized=0.0
    )


def run(engine: StepDriver, max_steps: int = 500) -> dict[str, list[messages.TokenItem]]:
    out: dict[str, list[messages.TokenItem]] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return out
        for item in engine.step():
            out.setdefault(item.rid, []).append(item)
    pytest.fail("the engine did not drain")


def tokens(items: list[messages.TokenItem]) -> list[int]:
    return [t for item in items for t in item.token_ids]


def test_batched_equals_alone_and_items_carry_metadata(leader: Any) -> None:
    alone = {}
    for i, prompt in enumerate(PROMPTS):
        engine = make_engine(leader)
        assert engine.add(request(f"r{i}", prompt, stop=["zz"])) is None
        alone[f"r{i}"] = tokens(run(engine)[f"r{i}"])
    engine = make_engine(leader)
    for i, prompt in enumerate(PROMPTS):
        engine.add(request(f"r{i}", prompt, stop=["zz"]))
    items = run(engine)
    assert {rid: tokens(v) for rid, v in items.items()} == alone
    for i, prompt in enumerate(PROMPTS):
        first, last = items[f"r{i}"][0], items[f"r{i}"][-1]
        assert first.prompt_tokens == len(prompt) and first.stop == ["zz"]
        assert first.first_scheduled is not None
        assert last.finish_reason == "length" and last.finished is not None
        assert all(it.finish_reason is None for it in items[f"r{i}"][:-1])
    assert not engine.tracked
    assert engine.stats().pages_used == engine.stats().pages_cached  # nothing held


def test_preemption_recomputes_to_the_same_tokens(leader: Any) -> None:
    roomy = make_engine(leader)
    squeezed = make_engine(leader, num_pages=5)
    for engine in (roomy, squeezed):
        for i, prompt in enumerate(PROMPTS):
            engine.add(request(f"r{i}", prompt, max_new=24))
    want = {rid: tokens(v) for rid, v in run(roomy).items()}
    assert {rid: tokens(v) for rid, v in run(squeezed).items()} == want


def test_abort_releases_pages_and_reports_abort(leader: Any) -> None:
    engine = make_engine(leader)
    engine.add(request("a", PROMPTS[0], max_new=100))
    engine.step()
    engine.step()
    assert engine.stats().pages_used - engine.stats().pages_cached > 0
    engine.abort("a", "test")
    items = engine.step()
    assert [(i.rid, i.finish_reason) for i in items] == [("a", "abort")]
    assert engine.stats().pages_used == engine.stats().pages_cached
    assert not engine.has_work() and not engine.tracked


def test_rejected_request_becomes_an_error_item(leader: Any) -> None:
    engine = make_engine(leader, num_pages=2)
    error = engine.add(request("big", list(range(1, 40)), max_new=8))
    assert error is not None and error.error and "KV pages" in error.error
    assert not engine.has_work()


def test_a_stop_token_finishes_the_request(leader: Any) -> None:
    free = tokens(run_one(make_engine(leader), SamplingParams(temperature=0.0, max_new_tokens=8)))
    stop_at = free[2]
    params = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=[stop_at])
    items = run_one(make_engine(leader), params)
    assert tokens(items) == free[: free.index(stop_at) + 1]
    assert items[-1].finish_reason == "stop"


def run_one(engine: StepDriver, params: SamplingParams) -> list[messages.TokenItem]:
    msg = messages.TokenizedRequest(
        rid="x", input_ids=PROMPTS[1], sampling=params, received=0.0, tokenized=0.0
    )
    engine.add(msg)
    return run(engine)["x"]
