"""Serving an architecture preset with dummy weights and a borrowed tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from conftest import running_server

from core.scheduler import Plan, PrefillChunk, SchedulerConfig
from engine.launch.model_source import resolve_source
from engine.models.setup import ModelNotFoundError
from engine.runner import ModelRunner, RunnerArgs, StepInputs
from engine.sampling import SamplingParams

PRESET = "tiny-llama"
SMOLLM2_IDS = 49152


def test_runner_samples_below_its_vocab_limit() -> None:
    torch.set_num_threads(1)
    args = RunnerArgs(
        PRESET,
        dummy_weights=True,
        scheduler=SchedulerConfig(num_pages=16, page_size=8),
        vocab_limit=7,
    )
    runner = ModelRunner(args)
    prompt = list(range(3, 23))
    plan = Plan(
        0,
        prefill=(
            PrefillChunk("a", 0, 20, True, (0, 1, 2)),
            PrefillChunk("b", 0, 20, True, (3, 4, 5)),
        ),
    )
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3)]
    logits = runner.logits(plan, StepInputs([prompt, prompt], [], params, [0, 0]))
    assert logits is not None and logits.shape[-1] == runner.config.vocab_size  # the full head
    assert all(
        0 <= t < 7
        for t in runner.step(plan, StepInputs([prompt, prompt], [], params, [0, 0])).tokens
    )


def test_a_preset_borrows_its_tokenizer(model_ready: str) -> None:
    qwen = resolve_source("Qwen2-0.5B", None, dummy_weights=True)
    assert (qwen.model_path, qwen.tokenizer_path) == ("qwen2-0.5b", Path(model_ready))
    assert (qwen.vocab_size, qwen.vocab_limit) == (151936, SMOLLM2_IDS)
    assert qwen.eos_token_ids == (2,)  # the tokenizer's, not Qwen's
    assert qwen.context_len == 32768
    tiny = resolve_source(PRESET, "smollm2-135m", dummy_weights=True)
    assert (tiny.vocab_size, tiny.vocab_limit) == (512, None)  # the tokenizer is the larger one
    own = resolve_source(model_ready, "smollm2-135m", dummy_weights=False)
    assert (own.tokenizer_path, own.vocab_limit, own.eos_token_ids) == (
        Path(model_ready),
        None,
        (2,),
    )


@pytest.mark.parametrize(
    ("model", "tokenizer", "dummy", "message"),
    [
        (PRESET, None, False, "presets need --dummy-weights"),
        ("no-such-model", None, True, "smollm2-135m.*tiny-llama"),
        (PRESET, "no-such-tokenizer", True, "no-such-tokenizer"),
    ],
)
def test_bad_combinations_are_clear_errors(
    model: str, tokenizer: str | None, dummy: bool, message: str
) -> None:
    with pytest.raises(ModelNotFoundError, match=message):
        resolve_source(model, tokenizer, dummy_weights=dummy)


def test_preset_without_dummy_weights_is_a_clear_cli_error() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lab.cli.engine", "serve", "--model", PRESET, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "presets need --dummy-weights" in out.stderr and "Traceback" not in out.stderr


def sse_data(body: str) -> list[dict[str, Any]]:
    lines = [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.slow
def test_serve_a_preset_with_dummy_weights(model_ready: str) -> None:
    sampling = {"max_tokens": 8, "temperature": 1.0, "seed": 1, "ignore_eos": True}
    with running_server("--dummy-weights", model=PRESET, cpu_threads=2) as server:
        models = httpx.get(f"{server.url}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == [PRESET]

        chat = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": PRESET, "messages": [{"role": "user", "content": "Hi"}], **sampling},
            timeout=60,
        )
        assert chat.status_code == 200, chat.text
        body = chat.json()
        assert body["model"] == PRESET
        assert body["choices"][0]["message"]["content"]
        usage = body["usage"]
        assert usage["completion_tokens"] == 8 and usage["prompt_tokens"] > 1
        assert usage["total_tokens"] == usage["prompt_tokens"] + 8

        stream = httpx.post(
            f"{server.url}/v1/completions",
            json={
                "model": PRESET,
                "prompt": "Once upon a time",
                "stream": True,
                "stream_options": {"include_usage": True},
                **sampling,
            },
            timeout=60,
        )
        assert stream.status_code == 200, stream.text
        chunks = sse_data(stream.text)
        assert {c["model"] for c in chunks} == {PRESET}
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        assert text
        assert chunks[-1]["usage"]["completion_tokens"] == 8
