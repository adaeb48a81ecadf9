"""All CPU stage costs of a profile, as profile rows (see ``cpu_stages`` and ``http_stages``)."""

from __future__ import annotations

import sys
from pathlib import Path

from engine.ipc.config import ServeConfig
from lab.profile.cpu_stages import (
    BUSY_TOKENS,
    TOKENIZE_IDLE_S,
    measure_detokenize,
    measure_ipc,
    measure_schedule,
    measure_tokenize,
    measure_tokenize_busy,
)
from lab.profile.http_stages import CONCURRENCY, measure_http
from sim.costs.profile import EMPTY_SHAPE, ProfileRow

PROSE = Path(__file__).resolve().parents[2] / "README.md"


def measure_stages(cfg: ServeConfig, repeats: int, info: dict[str, str]) -> list[ProfileRow]:
    """Time every CPU stage with the server's tokenizer; note what was timed in ``info``."""
    from engine.tokenizer.prompt import load_tokenizer

    tokenizer = load_tokenizer(cfg.tokenizer_path)
    text = PROSE.read_text(encoding="utf-8")
    ids = list(tokenizer.encode(text, add_special_tokens=False))[:1024]
    print(
        "timing the CPU stages: tokenize (idle, busy), detokenize, ipc, http, schedule",
        file=sys.stderr,
    )
    costs = [
        measure_tokenize(tokenizer, cfg, repeats),
        *measure_tokenize_busy(tokenizer, cfg, repeats),
        measure_detokenize(tokenizer, ids[:256], repeats),
        measure_ipc(ids, repeats),
        *measure_http(repeats),
    ]
    per_step, per_request, points = measure_schedule(repeats)
    costs += [per_step, per_request]
    info["cpu_stages"] = (
        f"tokenizer {cfg.tokenizer_path}; tokenize = the worker's work on a "
        f"new 1024-token engine bench prompt after {TOKENIZE_IDLE_S:g} s idle, per token; "
        f"tokenize_busy_N = the same on new {min(BUSY_TOKENS, cfg.max_model_len // 2)}-token "
        "prompts back to back, N workers at once, per token; "
        "detokenize = TokenBatch of 32 one-token items through Detokenizer.process, per token; "
        "ipc = half a ZeroMQ ipc:// round trip of a 1024-id TokenizedRequest; "
        f"frontend + stream = CPU time of the real app's event loop for {CONCURRENCY} "
        "concurrent streamed /v1/completions fed one batch a step, fitted per request + per "
        "chunk; schedule(+_request) = StepDriver.step with an instant model, fitted over "
        f"decode batch {points}"
    )
    return [
        ProfileRow(c.kind, EMPTY_SHAPE, cfg.tp_size, c.median, c.low, c.high, c.repeats)
        for c in costs
    ]
