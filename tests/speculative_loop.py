"""The step loop of the speculative decoding tests: SmolLM2-135M on CPU, requests served to
the end by the engine's ``StepDriver`` (a drafter, and the acceptance rule, as asked)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from core.scheduler import SchedulerConfig
from core.scheduler.drafter import Drafter, NgramDrafter
from engine.ipc.messages import TokenizedRequest
from engine.runner import ModelRunner, RunnerArgs
from engine.sampling import SamplingParams
from engine.scheduler_proc.driver import Launched, LaunchFn, StepDriver
from engine.scheduler_proc.recorder import StepRecorder
from engine.speculative.synthetic import SyntheticAcceptance

PASSAGE = (
    "The lighthouse keeper climbed the stairs every evening at dusk, lit the great lamp, "
    "and wrote the weather in a small blue notebook before he went to sleep."
)
PROMPTS = {
    "repeat": f"Repeat this text exactly, word for word:\n\n{PASSAGE}",
    "chat0": "What is the capital of France?",
    "chat1": "Write a haiku about the sea.",
}
_ids = itertools.count()


def chat_ids(tokenizer: Any) -> dict[str, list[int]]:
    """``PROMPTS`` as chat prompts' token ids."""
    out = {}
    for name, text in PROMPTS.items():
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        out[name] = [int(i) for i in (ids["input_ids"] if not isinstance(ids, list) else ids)]
    return out


def cpu_runner() -> ModelRunner:
    return ModelRunner(
        RunnerArgs(model="smollm2-135m", scheduler=SchedulerConfig(num_pages=96), dtype="float32")
    )


@dataclass
class Run:
    """What a loop produced: tokens, log-probs and finish reason per request, and per step
    the tokens each request got (several: verified drafts)."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[Any]] = field(default_factory=dict)
    finish: dict[str, str] = field(default_factory=dict)
    per_step: list[list[int]] = field(default_factory=list)


def run(
    runner: ModelRunner,
    requests: dict[str, tuple[list[int], SamplingParams]],
    k: int = 0,
    overlap: bool = False,
    launch: LaunchFn | None = None,
    recorder: StepRecorder | None = None,
    *,
    drafter: Drafter | None = None,
    acceptance: SyntheticAcceptance | None = None,
    tag: str | None = None,
) -> tuple[Run, StepDriver]:
    """Serve ``requests`` (name -> prompt, params) to the end; ``k`` > 0 drafts with
    ``drafter`` (default: n-grams). ``launch``: the runner's by default. Request ids are
    ``name-tag``; ``tag`` left out, a fresh one (the runner outlives the driver)."""
    config = SchedulerConfig(num_pages=96, num_draft_tokens=k)
    if k and drafter is None:
        drafter = NgramDrafter()
    eos = runner.eos_token_ids
    driver = StepDriver(config, launch or runner.launch, eos, recorder, drafter, acceptance)
    names = {}
    tag = str(next(_ids)) if tag is None else tag
    for name, (prompt, params) in requests.items():
        rid = f"{name}-{tag}"
        names[rid] = name
        assert driver.add(TokenizedRequest(rid, prompt, params, 0.0, 0.0)) is None
    out = Run()
    in_flight: Launched | None = None
    while driver.has_work() or in_flight is not None:
        items, in_flight, _ = driver.advance(in_flight, overlap)
        for item in items:
            assert item.error is None, item.error
            name = names[item.rid]
            out.tokens.setdefault(name, []).extend(item.token_ids)
            out.logprobs.setdefault(name, []).extend(item.logprobs)
            if item.token_ids:
                out.per_step.append(item.token_ids)
            if item.finish_reason is not None:
                out.finish[name] = item.finish_reason
    return out, driver


def spec_metrics(server: Any) -> dict[str, float]:
    """A running server's ``/metrics`` once its speculative counters have come (with the
    scheduler's next stats update after the requests served)."""
    metrics: dict[str, float] = server.metrics()
    for _ in range(50):
        if metrics.get("engine_spec_decode_num_drafts_total"):
            break
        time.sleep(0.1)
        metrics = server.metrics()
    return metrics
