"""``--speculative synthetic``: drafts of the last token, accepted at set rates.

The rule itself (``SyntheticAcceptance``): the accepted lengths of many draws
follow the per-position rates, a draw depends on the request id and output
index only. Then the engine's step loop on the real SmolLM2-135M (CPU):
rate 1 delivers ``K + 1`` tokens a verify, rate 0 one (the plain greedy
tokens), the same request ids give the same tokens, the output limit and
stop tokens hold, the counters and the step record count what was accepted;
the settings' errors; and one run through ``engine serve``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from conftest import running_server
from speculative_loop import Run, chat_ids, cpu_runner, run, spec_metrics
from transformers import AutoTokenizer

from core.scheduler import Request, SchedulerConfig
from core.scheduler.drafter import RepeatDrafter
from engine.ipc.messages import TokenizedRequest
from engine.models.setup import ensure_model
from engine.runner import ModelRunner
from engine.sampling import SamplingParams
from engine.scheduler_proc.driver import Launched, StepDriver
from engine.scheduler_proc.recorder import StepRecorder
from engine.speculative import DEFAULT_DRAFT_TOKENS, SpeculativeConfig
from engine.speculative.synthetic import SyntheticAcceptance, parse_rates
from schema.steprecord import read_step_record
from sim.costs.acceptance import AcceptanceModel

torch.set_num_threads(2)

NEW_TOKENS = 24
K = 3


def expected_lengths(rates: list[float], k: int) -> list[float]:
    """P(j accepted) for j = 0 .. k under per-position conditional rates."""
    out, reach = [], 1.0
    for i in range(k):
        out.append(reach * (1 - rates[i]))
        reach *= rates[i]
    return [*out, reach]


@pytest.mark.parametrize(
    "given, rates", [((0.9, 0.7, 0.5, 0.3), [0.9, 0.7, 0.5, 0.3]), ((0.6,), [0.6] * 4)]
)
def test_accepted_lengths_follow_the_rates(given: tuple[float, ...], rates: list[float]) -> None:
    """20,000 slots (fixed ids: the same draws every run): each frequency within 0.015 of its
    probability, over 4 standard deviations."""
    rule = SyntheticAcceptance(given)
    n = 20_000
    counts = [0] * 5
    for i in range(n):
        counts[rule.accepted(f"req-{i}", 7, 4)] += 1
    for got, want in zip(counts, expected_lengths(rates, 4), strict=True):
        assert abs(got / n - want) < 0.015, (counts, want)


def test_a_draw_is_decided_by_the_request_and_output_index() -> None:
    rule = SyntheticAcceptance((0.5,))
    draws = [rule.accepted(f"r{i}", i, 8) for i in range(200)]
    assert draws == [SyntheticAcceptance((0.5,)).accepted(f"r{i}", i, 8) for i in range(200)]
    assert len(set(draws)) > 3
    for n in range(50):  # a draft token's draw is its output index's, wherever its slot starts
        accepted = rule.accepted("x", n, 8)
        if accepted:
            assert rule.accepted("x", n + 1, 7) == accepted - 1
    assert SyntheticAcceptance((1.0,)).accepted("x", 3, 5) == 5
    assert SyntheticAcceptance((0.0,)).accepted("x", 3, 5) == 0
    verify = SyntheticAcceptance((1.0, 1.0, 0.0)).verifier(["a", "b"], [4, 9])
    assert verify(1, [70, 71, 72, 73], [5, 6, 7]) == [5, 6, 72]  # the model's token at 2


def test_the_repeat_drafter_proposes_the_last_token() -> None:
    req = Request("r", prompt_len=3, prompt=[5, 6, 7], max_new_tokens=8)
    drafter = RepeatDrafter()
    assert drafter.propose(req, 3) == (7, 7, 7)
    req.output.append(9)
    assert drafter.propose(req, 2) == (9, 9)
    assert drafter.propose(req, 0) == ()
    assert drafter.propose(Request("s", prompt_len=3, max_new_tokens=8), 2) == ()  # no tokens


def test_synthetic_settings_are_checked() -> None:
    base = SchedulerConfig(num_pages=8)
    synthetic = SpeculativeConfig("synthetic", acceptance_rate=(0.7,))
    assert synthetic.check(base, k_given=False).num_draft_tokens == DEFAULT_DRAFT_TOKENS
    listed = SpeculativeConfig("synthetic", acceptance_rate=(0.9, 0.5))
    assert listed.check(base, k_given=False).num_draft_tokens == 2  # K from the list
    three = replace(base, num_draft_tokens=3)
    with pytest.raises(ValueError, match="gives 2 per-position rates for --num-draft-tokens 3"):
        listed.check(three, k_given=True)
    with pytest.raises(ValueError, match="needs --acceptance-rate"):
        SpeculativeConfig("synthetic").check(base, k_given=False)
    for method in ("none", "ngram"):
        with pytest.raises(ValueError, match="not of --speculative " + method):
            SpeculativeConfig(method, acceptance_rate=(0.5,)).check(base, k_given=False)
    with pytest.raises(ValueError, match="must be in"):
        SpeculativeConfig("synthetic", acceptance_rate=(1.2,)).check(base, k_given=False)
    for text in ("1.5", "0.5,-0.1", "half", "0.5,,0.2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rates(text)
    assert parse_rates("0.9,0.5") == (0.9, 0.5)
    assert isinstance(synthetic.drafter(), RepeatDrafter)
    assert SpeculativeConfig("ngram").acceptance() is None
    assert synthetic.card(three) == {
        "method": "synthetic",
        "num_draft_tokens": 3,
        "acceptance_rate": [0.7],
    }


# ---------------------------------------------------------------- the engine's step loop
@pytest.fixture(scope="module")
def prompts() -> dict[str, list[int]]:
    return chat_ids(AutoTokenizer.from_pretrained(str(ensure_model("smollm2-135m"))))


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return cpu_runner()


def greedy(prompts: dict[str, list[int]], limit: int = NEW_TOKENS, **params: Any) -> dict[str, Any]:
    p = SamplingParams(temperature=0.0, max_new_tokens=limit, ignore_eos=True, **params)
    return {name: (ids, p) for name, ids in prompts.items()}


def synthetic(
    runner: ModelRunner, requests: dict[str, Any], rates: tuple[float, ...], **kw: Any
) -> tuple[Run, Any]:
    """``requests`` served with drafts of ``K`` accepted at ``rates``."""
    rule = SyntheticAcceptance(rates)
    return run(runner, requests, K, drafter=RepeatDrafter(), acceptance=rule, **kw)


@pytest.mark.slow
def test_rate_one_delivers_every_draft_and_the_models_token(
    runner: ModelRunner, prompts: dict[str, list[int]]
) -> None:
    out, driver = synthetic(runner, greedy(prompts), (1.0,))
    spec = driver.speculative
    assert spec is not None and spec.verify_slots > 0
    assert spec.accepted_tokens == spec.draft_tokens
    assert spec.accepted_lengths[K] >= spec.verify_slots - len(prompts)  # short: the limit
    assert all(len(tokens) == NEW_TOKENS for tokens in out.tokens.values())
    assert max(len(step) for step in out.per_step) == K + 1
    for tokens in out.tokens.values():  # prefill's token, then K copies of it and a new one
        assert tokens[1 : K + 1] == [tokens[0]] * K


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "overlap"])
@pytest.mark.slow
def test_rate_zero_delivers_the_plain_tokens_one_a_step(
    runner: ModelRunner, prompts: dict[str, list[int]], overlap: bool
) -> None:
    plain, _ = run(runner, greedy(prompts))
    out, driver = synthetic(runner, greedy(prompts), (0.0,), overlap=overlap)
    spec = driver.speculative
    assert spec is not None and spec.verify_slots > 0 and spec.accepted_tokens == 0
    assert all(len(step) == 1 for step in out.per_step)
    assert out.tokens == plain.tokens


@pytest.mark.slow
def test_the_same_requests_draw_the_same_tokens(
    runner: ModelRunner, prompts: dict[str, list[int]]
) -> None:
    rates = (0.9, 0.6, 0.3)
    first, driver = synthetic(runner, greedy(prompts), rates, tag="same")
    again, _ = synthetic(runner, greedy(prompts), rates, tag="same")
    assert first == again
    spec = driver.speculative
    assert spec is not None and 0 < spec.accepted_tokens < spec.draft_tokens
    assert sum(spec.accepted_lengths) == spec.verify_slots


@pytest.mark.slow
def test_the_per_position_tests_give_the_rates_back_where_drafts_are_cut_short(
    runner: ModelRunner, prompts: dict[str, list[int]]
) -> None:
    """Every draft accepted whole (rate 1) and 7 tokens a request, so drafts are cut short at
    the output limit: the histogram alone reads a short draft's end as a rejection (a rate
    below 1), the engine's per-position tests do not."""
    _, driver = synthetic(runner, greedy(prompts, 7), (1.0,))
    assert driver.speculative is not None
    stats = driver.speculative.snapshot()
    assert stats.accepted_lengths[K] > 0 and sum(stats.accepted_lengths[1:K]) > 0
    tested = stats.tested_per_position
    model = AcceptanceModel.of_histogram(stats.accepted_lengths, tested=tested)
    assert model.rates == (1.0,) * K
    assert min(AcceptanceModel.of_histogram(stats.accepted_lengths).rates) < 1.0


@pytest.mark.parametrize("limit", [1, 3, 5, 6])
@pytest.mark.slow
def test_max_tokens_is_honoured_exactly(
    runner: ModelRunner, prompts: dict[str, list[int]], limit: int
) -> None:
    out, _ = synthetic(runner, greedy({"chat0": prompts["chat0"]}, limit), (1.0,))
    assert len(out.tokens["chat0"]) == limit
    assert out.finish["chat0"] == "length"


@pytest.mark.slow
def test_a_stop_token_ends_the_request(runner: ModelRunner, prompts: dict[str, list[int]]) -> None:
    """The same request id both times: the same draws, so the same tokens up to the stop."""
    rates = (0.8, 0.5, 0.5)
    free, _ = synthetic(runner, greedy({"chat1": prompts["chat1"]}), rates, tag="stop")
    tokens = free.tokens["chat1"]
    end = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])
    requests = greedy({"chat1": prompts["chat1"]}, stop_token_ids=[tokens[end]])
    out, _ = synthetic(runner, requests, rates, tag="stop")
    assert out.tokens["chat1"] == tokens[: end + 1]
    assert out.finish["chat1"] == "stop"


@pytest.mark.slow
def test_the_step_record_counts_the_synthetic_acceptance(
    runner: ModelRunner, prompts: dict[str, list[int]], tmp_path: Path
) -> None:
    path = tmp_path / "steps.csv"
    recorder = StepRecorder(path, flush_every=1, speculative=True)
    _, driver = synthetic(runner, greedy(prompts), (0.7, 0.5, 0.5), recorder=recorder)
    recorder.close()
    steps = read_step_record(path)
    spec = driver.speculative
    assert spec is not None and spec.accepted_tokens > 0
    assert int(steps["draft_tokens"].sum()) == spec.draft_tokens
    assert int(steps["accepted_tokens"].sum()) == spec.accepted_tokens


@pytest.mark.slow
def test_serve_synthetic_reports_its_acceptance() -> None:
    body = {"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 17,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    args = ("--speculative", "synthetic", "--num-draft-tokens", "3", "--acceptance-rate", "1")
    with running_server("--num-pages", "128", *args, cpu_threads=2) as server:
        resp = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 17
        card = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]
        assert card["speculative"] == {
            "method": "synthetic",
            "num_draft_tokens": 3,
            "acceptance_rate": [1.0],
        }
        metrics = spec_metrics(server)
        drafted = metrics["engine_spec_decode_num_draft_tokens_total"]
        assert drafted > 0
        assert metrics["engine_spec_decode_num_accepted_tokens_total"] == drafted


@pytest.mark.slow
def test_with_overlap_a_verify_step_is_finished_before_the_next_is_formed(
    runner: ModelRunner, prompts: dict[str, list[int]]
) -> None:
    """A request whose draft is in flight would sit the next step out, and requests arriving
    meanwhile could split the running ones into groups verifying in turn; the loop finishes a
    step with drafts at once, so no such step is ever left in flight."""
    config = SchedulerConfig(num_pages=96, num_draft_tokens=K)
    rule = SyntheticAcceptance((0.6, 0.6, 0.6))
    driver = StepDriver(config, runner.launch, runner.eos_token_ids, None, RepeatDrafter(), rule)
    waiting = list(greedy(prompts).items())
    in_flight: Launched | None = None
    iterations = 0
    while waiting or driver.has_work() or in_flight is not None:
        if waiting and iterations % 3 == 0:  # one request every third iteration
            name, (ids, params) = waiting.pop(0)
            assert driver.add(TokenizedRequest(name, ids, params, 0.0, 0.0)) is None
        _, in_flight, _ = driver.advance(in_flight, True)
        assert in_flight is None or not in_flight.plan.num_draft_tokens
        iterations += 1
    spec = driver.speculative
    assert spec is not None and spec.verify_slots > len(prompts)
