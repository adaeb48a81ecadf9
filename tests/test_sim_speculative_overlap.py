"""Speculative decoding with overlap in the simulator: a verify step completes before the next
step is formed, as in the engine's loop (``StepDriver.advance``), so the running requests
never split into groups that verify in turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schema.traces import load_trace
from sim.config import build_config
from sim.replay import run_replay

PROFILE = Path(__file__).resolve().parents[1] / "profiles/cpu-xeon-2core_smollm2-135m.csv"


@pytest.mark.parametrize("draft_share", [1.0, 0.7])
def test_no_verify_step_is_left_in_flight(tmp_path: Path, draft_share: float) -> None:
    """Requests arriving while others verify: every step after a verify step is launched with
    nothing in flight."""
    rows = [
        {"timestamp": 37 * i, "input_length": 40 + 9 * i, "output_length": 30 + 5 * (i % 4)}
        for i in range(12)
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config(
        model="smollm2-135m", profile=str(PROFILE), overlap=True, speculative="ngram",
        num_draft_tokens=4, acceptance="0.6,0.8,0.8,0.8", draft_share=draft_share,
    )  # fmt: skip
    result = run_replay(load_trace(path), cfg, progress=False, record_steps=True)
    steps = result.engine_steps
    assert steps is not None
    verify = steps.index[steps["draft_tokens"] > 0]
    assert len(verify) > 10
    after = [i + 1 for i in verify if i + 1 < len(steps)]
    assert not steps.loc[after, "in_flight"].any()
    assert (result.requests["status"] == "completed").all()
