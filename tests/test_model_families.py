"""Our Llama/Qwen2/Qwen3 code against HF transformers on tiny random checkpoints.

Each family is saved by transformers as a real safetensors folder, loaded by our
loader, and run through paged attention with a scattered page table, chunked
prefill and decode; logits must match HF's full-sequence forward.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from core.scheduler import DecodeSlot, Plan, PrefillChunk, SchedulerConfig
from engine.runner import ModelRunner, RunnerArgs, StepInputs
from engine.sampling import SamplingParams
from schema.models import ModelConfig

torch.set_num_threads(2)

SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 300,
    "max_position_embeddings": 512,
}
FAMILIES: dict[str, Callable[[], Any]] = {
    "llama31": lambda: LlamaConfig(
        **SHAPE,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        tie_word_embeddings=False,
    ),
    "llama-bias": lambda: LlamaConfig(**SHAPE, attention_bias=True, tie_word_embeddings=True),
    "qwen2": lambda: Qwen2Config(**SHAPE, tie_word_embeddings=True),
    "qwen3": lambda: Qwen3Config(**SHAPE, tie_word_embeddings=True),
}
PAGE = 4
PAGES = (9, 2, 14, 5, 11, 0, 7, 3)  # scattered on purpose
SP = SamplingParams(temperature=0.0)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _checkpoint(family: str, folder: Path) -> Any:
    torch.manual_seed(0)
    config = FAMILIES[family]()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    model.eval()
    model.save_pretrained(str(folder))
    return model


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_paged_chunked_decode_logits_match_hf(family: str, device: str, tmp_path: Path) -> None:
    hf = _checkpoint(family, tmp_path)
    config = ModelConfig.from_dir(tmp_path)
    assert config.qk_norm == (family == "qwen3")
    assert config.qkv_bias == (family in ("qwen2", "llama-bias"))
    runner = ModelRunner(
        RunnerArgs(
            model=str(tmp_path),
            device=device,
            scheduler=SchedulerConfig(num_pages=16, page_size=PAGE),
            dtype="float32",
        )
    )
    tol: dict[str, Any] = (
        {"atol": 2e-4, "rtol": 1e-4} if device == "cpu" else {"atol": 1e-3, "rtol": 1e-3}
    )
    seq = torch.randint(0, 300, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0].float()

    # prompt of 20 in chunks [0, 9) and [9, 20), then decode positions 20, 21, 22
    chunk1 = Plan(0, prefill=(PrefillChunk("a", 0, 9, False, PAGES),))
    assert runner.logits(chunk1, StepInputs([seq[:9]], [], [], [])) is not None
    chunk2 = Plan(1, prefill=(PrefillChunk("a", 9, 11, True, PAGES),))
    got = runner.logits(chunk2, StepInputs([seq[9:20]], [], [SP], [0]))
    assert got is not None
    torch.testing.assert_close(got[0].cpu(), ref[19], **tol)
    for pos in (20, 21, 22):
        plan = Plan(pos, decode=(DecodeSlot("a", pos, PAGES),))
        got = runner.logits(plan, StepInputs([], [seq[pos]], [SP], [pos - 19]))
        assert got is not None
        torch.testing.assert_close(got[0].cpu(), ref[pos], **tol)


def test_mixed_batch_matches_separate_runs(tmp_path: Path) -> None:
    """A prefill chunk, a cache-hit chunk and two decodes of different lengths in one step."""
    hf = _checkpoint("qwen3", tmp_path)
    runner = ModelRunner(
        RunnerArgs(model=str(tmp_path), scheduler=SchedulerConfig(num_pages=32, page_size=PAGE))
    )
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (13, 7, 18, 10)]
    with torch.no_grad():
        refs = [hf(torch.tensor([s])).logits[0, -1].float() for s in seqs]
    tables = [tuple(range(i * 8, i * 8 + 8))[::-1] for i in range(4)]
    # fill the KV of what is already "computed": seq 1 prefix [0, 4), seqs 2 and 3 all but last
    warm = Plan(
        0,
        prefill=(
            PrefillChunk("b", 0, 4, False, tables[1]),
            PrefillChunk("c", 0, 17, False, tables[2]),
            PrefillChunk("d", 0, 9, False, tables[3]),
        ),
    )
    runner.logits(warm, StepInputs([seqs[1][:4], seqs[2][:17], seqs[3][:9]], [], [], []))
    mixed = Plan(
        1,
        prefill=(
            PrefillChunk("a", 0, 13, True, tables[0]),
            PrefillChunk("b", 4, 3, True, tables[1]),
        ),
        decode=(DecodeSlot("c", 17, tables[2]), DecodeSlot("d", 9, tables[3])),
    )
    inputs = StepInputs([seqs[0], seqs[1][4:]], [seqs[2][17], seqs[3][9]], [SP] * 4, [0] * 4)
    got = runner.logits(mixed, inputs)
    assert got is not None and got.shape == (4, 300)
    for i in range(4):
        torch.testing.assert_close(got[i], refs[i], atol=2e-4, rtol=1e-4)
    assert runner.step(mixed, inputs).tokens == [int(r.argmax()) for r in refs]
