"""Bad runner arguments, bad plans and unknown models get clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.scheduler import DecodeSlot, Plan, PrefillChunk, SchedulerConfig
from engine.models.setup import ModelNotFoundError, ensure_model, resolve_model, setup_main
from engine.runner import ModelRunner, RunnerArgs, StepInputs
from engine.runner.inputs import FROM_LAST_SAMPLE
from engine.runner.tp import TPLeader
from engine.sampling import SamplingParams

torch.set_num_threads(1)
SP = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(
        RunnerArgs(model="tiny-llama", dummy_weights=True, scheduler=SchedulerConfig(num_pages=8))
    )


@pytest.mark.parametrize(
    ("plan", "inputs", "message"),
    [
        (
            Plan(0, prefill=(PrefillChunk("a", 0, 4, True, (0,)),)),
            StepInputs([[1, 2, 3]], [], [SP], [0]),
            "request a: prefill chunk of length 4 got 3",
        ),
        (
            Plan(0, prefill=(PrefillChunk("a", 0, 20, True, (0,)),)),
            StepInputs([list(range(20))], [], [SP], [0]),
            "request a: 20 tokens need 2 pages",
        ),
        (
            Plan(0, decode=(DecodeSlot("b", 3, (8,)),)),
            StepInputs([], [1], [SP], [0]),
            r"page ids \[8\] outside the pool of 8",
        ),
        (
            Plan(0, decode=(DecodeSlot("b", 3, (1,)),)),
            StepInputs([], [1, 2], [SP], [0]),
            "sampling params|decode tokens",
        ),
        (
            Plan(0, decode=(DecodeSlot("b", 3, (1,)),)),
            StepInputs([], [1], [], []),
            "plan samples 1 requests",
        ),
        (
            Plan(0, decode=(DecodeSlot("b", 3, (1,)),)),
            StepInputs([], [-2], [SP], [0]),
            r"token ids must be in \[0, 512\)",
        ),
        (
            Plan(0, decode=(DecodeSlot("b", 3, (1,)),)),
            StepInputs([], [FROM_LAST_SAMPLE], [SP], [0]),
            "request b: its input token comes from the previous step, which sampled none",
        ),
        (
            Plan(0, prefill=(PrefillChunk("a", 0, 2, True, (0,)),)),
            StepInputs([[1, FROM_LAST_SAMPLE]], [], [SP], [0]),
            r"token ids must be in \[0, 512\), got values in \[-1, 1\]",
        ),
    ],
)
def test_bad_step_rejected(
    runner: ModelRunner, plan: Plan, inputs: StepInputs, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        runner.step(plan, inputs)


def test_empty_plan_returns_no_tokens(runner: ModelRunner) -> None:
    assert runner.step(Plan(0), StepInputs([], [], [], [])).tokens == []


def test_leader_with_one_rank_needs_no_process_group() -> None:
    leader = TPLeader(
        RunnerArgs(model="tiny-qwen3", dummy_weights=True, scheduler=SchedulerConfig(num_pages=4))
    )
    assert not torch.distributed.is_initialized()
    plan = Plan(0, prefill=(PrefillChunk("a", 0, 3, True, (2,)),))
    assert len(leader.step(plan, StepInputs([[4, 5, 6]], [], [SP], [0])).tokens) == 1
    leader.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        leader.step(plan, StepInputs([[4, 5, 6]], [], [SP], [0]))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (RunnerArgs(model="x", dtype="float8"), "unknown dtype"),
        (RunnerArgs(model="x", tp_size=2), "dist_init"),
        (RunnerArgs(model="x", mem_fraction=1.5), "mem_fraction"),
        (RunnerArgs(model="x", device="tpu"), "device"),
    ],
)
def test_bad_runner_args_rejected(args: RunnerArgs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        args.validate()


def test_model_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ensure_model("smollm2-135m")
    assert resolve_model(str(real)) == real
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == real
    with pytest.raises(ModelNotFoundError, match="neither a folder"):
        resolve_model("no-such-model")
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="engine setup --model smollm2-135m"):
        resolve_model("smollm2-135m")
    with pytest.raises(SystemExit) as exit_info:
        setup_main(["--model", "no-such-model"])
    assert exit_info.value.code == 2
    with pytest.raises(ModelNotFoundError, match="neither a folder"):
        ModelRunner(RunnerArgs(model="no-such-model"))
    with pytest.raises(ModelNotFoundError, match=r"dummy-weight presets: .*tiny-qwen3"):
        ModelRunner(RunnerArgs(model="no-such-model", dummy_weights=True))


def test_attention_backend_choice() -> None:
    from engine.attention import resolve_name

    assert resolve_name("auto", "cpu", torch.float32, 64) == "torch"
    assert resolve_name("auto", "cuda", torch.float32, 64) == "torch"  # no FlashInfer for fp32
    with pytest.raises(ValueError, match=r"unknown attention backend 'flashinfer' .*needs the"):
        ModelRunner(
            RunnerArgs(model="tiny-llama", dummy_weights=True, attention_backend="flashinfer")
        )
