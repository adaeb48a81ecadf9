"""``engine bench``'s warm-up uses prompts of its own: the first measured request finds nothing
of its prompt in the server's prefix cache."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import Server

from lab.bench.main import bench_main
from lab.bench.prompts import PromptMaker
from schema.traces import TraceRequest

pytestmark = pytest.mark.slow
PAGE = 16


def test_warmup_prompts_share_no_page_with_measured_ones(model_ready: str) -> None:
    from engine.tokenizer.prompt import load_tokenizer

    tokenizer = load_tokenizer(model_ready)
    maker = PromptMaker(tokenizer, "salt ")
    measured = [TraceRequest(f"r{i}", 0.0, 300, 1, hash_ids=(i % 2,)) for i in range(4)]
    measured.append(TraceRequest("warmup 0", 0.0, 300, 1))  # a rid that spells the seed
    warm = tokenizer.encode(maker.warmup_text(0, 300))
    assert len(warm) == 300 and warm != tokenizer.encode(maker.warmup_text(1, 300))
    for req in measured:
        ids = tokenizer.encode(maker.text(req))
        assert ids[:PAGE] != warm[:PAGE], req.rid


def test_first_measured_request_finds_no_cached_prefix(server: Server, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 200 * i, "input_length": 96, "output_length": 3} for i in range(3)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "bench"
    argv = [str(trace), "--url", server.url, "--warmup", "2", "--no-report", "--no-progress"]
    assert bench_main([*argv, "--out", str(out)]) == 0
    requests = pd.read_csv(out / "requests.csv")
    assert (requests["status"] == "completed").all()
    assert requests["cached_tokens"].tolist() == [0, 0, 0]
    assert json.loads((out / "summary.json").read_text())["prefix_hit_rate"] == 0
