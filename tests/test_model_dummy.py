"""Dummy weights: presets of real shapes build, tiny presets run steps (Qwen3 qk-norm included)."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

from core.scheduler import DecodeSlot, Plan, PrefillChunk, SchedulerConfig
from engine.models.llama import LlamaForCausalLM
from engine.runner import ModelRunner, RunnerArgs, StepInputs
from engine.sampling import SamplingParams
from schema.models import PRESETS, ModelConfig, get_preset

torch.set_num_threads(1)
GREEDY = SamplingParams(temperature=0.0)


@pytest.mark.parametrize(("name", "billions"), [("llama-3.1-8b", 8.03), ("qwen3-0.6b", 0.596)])
def test_real_shape_presets(name: str, billions: float) -> None:
    config = get_preset(name)
    model = LlamaForCausalLM(config, device="meta")
    count = sum(p.numel() for p in model.parameters())
    assert count == config.num_params
    assert abs(count / 1e9 - billions) / billions < 0.01
    if name == "llama-3.1-8b":
        assert config.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2
        assert config.kv_bytes_per_token(2, tp_size=4) == 2 * 32 * 2 * 128 * 2
    if name == "qwen3-0.6b":
        layer: Any = model.model.layers[0]
        assert layer.self_attn.q_norm is not None


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_hf_config_keys(name: str) -> None:
    config = get_preset(name)
    assert ModelConfig.from_hf(config.to_hf()) == config


def test_unknown_preset_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown model preset"):
        get_preset("gpt-17")
    assert {"llama-3.1-8b", "qwen3-0.6b", "tiny-llama", "tiny-qwen3"} <= set(PRESETS)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_dummy_preset_runs_and_chunking_is_exact(preset: str) -> None:
    runner = ModelRunner(
        RunnerArgs(
            model=preset, dummy_weights=True, scheduler=SchedulerConfig(num_pages=16, page_size=8)
        )
    )
    assert runner.eos_token_ids == [2]
    vocab = runner.config.vocab_size
    prompt = list(range(3, 23))
    whole = runner.logits(
        Plan(0, prefill=(PrefillChunk("a", 0, 20, True, (0, 1, 2)),)),
        StepInputs([prompt], [], [GREEDY], [0]),
    )
    assert whole is not None and whole.shape == (1, vocab) and torch.isfinite(whole).all()
    assert whole.std() > 1e-3, "dummy logits must not be flat"
    runner.logits(
        Plan(1, prefill=(PrefillChunk("b", 0, 12, False, (5, 4, 3)),)),
        StepInputs([prompt[:12]], [], [], []),
    )
    tail = runner.logits(
        Plan(2, prefill=(PrefillChunk("b", 12, 8, True, (5, 4, 3)),)),
        StepInputs([prompt[12:]], [], [GREEDY], [0]),
    )
    assert tail is not None
    torch.testing.assert_close(tail, whole, atol=1e-5, rtol=1e-5)
    token = runner.step(
        Plan(3, decode=(DecodeSlot("b", 20, (5, 4, 3)),)),
        StepInputs([], [int(whole.argmax())], [GREEDY], [1]),
    ).tokens
    assert len(token) == 1 and 0 <= token[0] < vocab


def test_dummy_weights_follow_the_seed() -> None:
    def logits(seed: int) -> torch.Tensor:
        runner = ModelRunner(
            RunnerArgs(
                model="tiny-qwen3",
                dummy_weights=True,
                scheduler=SchedulerConfig(num_pages=4),
                seed=seed,
            )
        )
        plan = Plan(0, prefill=(PrefillChunk("a", 0, 5, True, (0,)),))
        out = runner.logits(plan, StepInputs([[5, 6, 7, 8, 9]], [], [GREEDY], [0]))
        assert out is not None
        return out

    torch.testing.assert_close(logits(1), logits(1))
    assert not torch.allclose(logits(1), logits(2))


def test_default_kv_pool_size_on_cpu() -> None:
    runner = ModelRunner(RunnerArgs(model="tiny-llama", dummy_weights=True))
    assert runner.num_pages == 65536 // 16
    assert runner.kv.k[0].shape == (runner.num_pages + 1, 16, 2, 16)  # + the scratch page


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("preset", ["qwen3-0.6b", "tiny-llama"])
def test_dummy_preset_on_gpu(preset: str) -> None:
    """Real-shape dummy weights on the GPU: float32 equals the CPU, bfloat16 stays close."""
    prompt = list(range(10, 40))
    plan = Plan(0, prefill=(PrefillChunk("a", 0, 30, True, (3, 1)),))
    inputs = StepInputs([prompt], [], [GREEDY], [0])

    def logits(runner: ModelRunner) -> torch.Tensor:
        out = runner.logits(plan, inputs)
        assert out is not None
        return out.float().cpu()

    on_gpu = ModelRunner(
        RunnerArgs(
            model=preset,
            dummy_weights=True,
            scheduler=SchedulerConfig(num_pages=8),
            device="cuda",
            dtype="float32",
        )
    )
    on_cpu = ModelRunner(
        RunnerArgs(model=preset, dummy_weights=True, scheduler=SchedulerConfig(num_pages=8))
    )
    on_cpu.model.load_state_dict(on_gpu.model.state_dict())  # random streams differ per device
    gpu32 = logits(on_gpu)
    torch.testing.assert_close(gpu32, logits(on_cpu), atol=1e-3, rtol=1e-3)
    bf16 = ModelRunner(
        RunnerArgs(model=preset, dummy_weights=True, device="cuda", mem_fraction=0.5)
    )
    assert bf16.dtype == torch.bfloat16 and bf16.num_pages > 1000
    bf16.model.load_state_dict(on_gpu.model.state_dict())
    cosine = torch.nn.functional.cosine_similarity(logits(bf16), gpu32).item()
    assert cosine > 0.99, cosine
    decode = Plan(1, decode=(DecodeSlot("a", 30, (3, 1)),))
    assert len(bf16.step(decode, StepInputs([], [7], [GREEDY], [1]))) == 1
    del bf16, on_gpu
    gc.collect()
    torch.cuda.empty_cache()
