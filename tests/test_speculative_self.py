"""``--speculative self``: drafts from the served model's own first layers (CPU).

The self-drafter's dense K/V caches against the paged torch backend: on a model
whose last layer adds nothing (its output projections zeroed) the early exit *is*
the model, so every draft must be accepted. Then greedy output equal to plain
decoding on SmolLM2, incremental drafting equal to drafting from scratch (after
rejected drafts and after a cache is dropped), and the settings' checks.
"""

from __future__ import annotations

import dataclasses

import httpx
import pytest
import torch
from conftest import running_server
from speculative_loop import chat_ids, cpu_runner, run, spec_metrics
from transformers import AutoTokenizer

from core.scheduler import SchedulerConfig
from core.scheduler.request import Request
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import init_dummy
from engine.models.setup import ensure_model
from engine.runner import ModelRunner, RunnerArgs
from engine.sampling import SamplingParams
from engine.speculative import SpeculativeConfig
from engine.speculative.self_draft import SelfDrafter
from schema.models import get_preset

torch.set_num_threads(2)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def test_an_early_exit_that_is_the_model_has_every_draft_accepted() -> None:
    runner = ModelRunner(
        RunnerArgs(
            model="tiny-llama",
            dummy_weights=True,
            dtype="float32",
            scheduler=SchedulerConfig(num_pages=96),
        )
    )
    last = runner.model.model.layers[-1]
    with torch.no_grad():  # the last layer adds nothing to the residual stream
        last.self_attn.o_proj.weight.zero_()
        last.mlp.down_proj.weight.zero_()
    drafter = SelfDrafter(runner.model, len(runner.model.model.layers) - 1, 8)
    prompts = {f"p{i}": [(37 * i + 11 * j) % 500 + 3 for j in range(20 + 9 * i)] for i in range(3)}
    requests = {name: (ids, greedy(30)) for name, ids in prompts.items()}
    plain, _ = run(runner, requests)
    out, driver = run(runner, requests, 4, drafter=drafter)
    assert out.tokens == plain.tokens
    counters = driver.speculative
    assert counters is not None and counters.verify_slots > 0
    assert counters.accepted_tokens == counters.draft_tokens  # the early exit never disagrees


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "overlap"])
def test_greedy_output_equals_plain_decoding(overlap: bool) -> None:
    runner = cpu_runner()
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_model("smollm2-135m")))
    requests = {name: (ids, greedy(20)) for name, ids in chat_ids(tokenizer).items()}
    plain, _ = run(runner, requests, overlap=overlap)
    drafter = SelfDrafter(runner.model, 20, 8)
    out, driver = run(runner, requests, 3, overlap=overlap, drafter=drafter)
    assert out.tokens == plain.tokens
    counters = driver.speculative
    assert counters is not None and counters.verify_slots > 0
    assert counters.accepted_tokens > 0  # 20 of 30 layers agree with the model now and then


def test_drafting_as_tokens_come_equals_drafting_from_scratch() -> None:
    config = dataclasses.replace(get_preset("tiny-llama"), num_layers=3)
    model = LlamaForCausalLM(config)
    init_dummy(model, 5)
    model.eval()
    steady, fresh = SelfDrafter(model, 2, 2), SelfDrafter(model, 2, 2)
    prompt = [(7 * j) % 500 + 3 for j in range(40)]
    req = Request("a", prompt_len=len(prompt), prompt=prompt, max_new_tokens=64)
    first = steady.propose(req, 5)
    req.output += [first[0], first[1], (first[2] + 1) % 500]  # two accepted, then a correction
    for other in ("b", "c"):  # two other requests push "a"'s cache out and back
        steady.propose(Request(other, prompt_len=3, prompt=[5, 6, 7], max_new_tokens=8), 2)
    again = steady.propose(req, 5)
    assert list(again) == list(fresh.propose(req, 5))
    req.output += [again[0]]
    assert list(steady.propose(req, 3)) == list(fresh.propose(req, 3))
    assert steady.propose(req, 0) == ()


def test_self_draft_settings_are_checked() -> None:
    base = SchedulerConfig(num_pages=64)
    with pytest.raises(ValueError, match="--draft-layers N goes with --speculative self"):
        SpeculativeConfig("self").check(base, k_given=False)
    with pytest.raises(ValueError, match="--draft-layers N goes with --speculative self"):
        SpeculativeConfig("ngram", draft_layers=4).check(base, k_given=False)
    sized = SpeculativeConfig("self", draft_layers=4).check(base, k_given=False)
    assert sized.num_draft_tokens == 4
    model = LlamaForCausalLM(get_preset("tiny-llama"))
    with pytest.raises(ValueError, match="--draft-layers takes 1 to 1 of the model's 2 layers"):
        SelfDrafter(model, 2, 4)
    card = SpeculativeConfig("self", draft_layers=1).card(sized)
    assert card == {"method": "self", "num_draft_tokens": 4, "draft_layers": 1}


@pytest.mark.slow
def test_serve_with_a_self_draft(model_ready: str) -> None:
    args = ("--num-pages", "256", "--speculative", "self", "--draft-layers", "24")
    with running_server(*args, "--num-draft-tokens", "3") as server:
        card = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]
        assert card["speculative"] == {"method": "self", "num_draft_tokens": 3, "draft_layers": 24}
        body = {"model": "smollm2-135m", "prompt": "One, two, three, four,", "max_tokens": 12,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 12
        metrics = spec_metrics(server)
        assert metrics["engine_spec_decode_num_drafts_total"] > 0
