"""The simulator's self-draft (``--speculative self --draft-layers N``): the drafting layers'
time, priced from the same cost model as the steps, lands before the verify step's launch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.scheduler.request import Request
from core.scheduler.shape import StepShape
from schema.traces import load_trace
from sim.config import build_config
from sim.model.drafter import SharedDrafter, self_draft_price
from sim.replay import build_costs, run_replay

PROFILE = "profiles/cpu-xeon-2core_smollm2-135m.csv"


def trace(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 40.0 * i, "input_length": 64, "output_length": 33} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_trace(path)


def test_a_drafter_with_a_price_adds_up_its_drafts() -> None:
    drafter = SharedDrafter(1.0, price=lambda context: 0.001 * context)
    req = Request("r", prompt_len=10, prompt=list(range(10)), max_new_tokens=8)
    req.num_planned = 12
    assert len(drafter.propose(req, 3)) == 3
    assert drafter.take_spent() == pytest.approx(3 * 0.012)
    assert drafter.take_spent() == 0.0
    assert SharedDrafter(0.0, price=lambda c: 1.0).propose(req, 3) == ()


def test_a_self_draft_token_is_a_share_of_a_batch_one_decode() -> None:
    gpu, _ = build_costs(build_config(model="smollm2-135m", profile=PROFILE))
    price = self_draft_price(0.25, gpu)
    for context in (10, 500):
        decode = gpu.step_time(StepShape.decode(1, context + 1, context + 1))
        assert price(context) == pytest.approx(0.25 * decode)


@pytest.mark.parametrize("overlap", [False, True])
def test_drafting_time_comes_before_each_verify_steps_launch(tmp_path: Path, overlap: bool) -> None:
    kw = {"model": "smollm2-135m", "profile": PROFILE, "acceptance": "0.6", "overlap": overlap,
          "num_draft_tokens": 3}  # fmt: skip
    runs = {}
    for method, extra in (("synthetic", {}), ("self", {"draft_layers": 10})):
        cfg = build_config(speculative=method, **kw, **extra)
        runs[method] = run_replay(trace(tmp_path), cfg, progress=False, record_steps=True)
    free, paid = runs["synthetic"], runs["self"]
    a, b = free.engine_steps, paid.engine_steps
    assert a is not None and b is not None and len(a) == len(b)  # the same steps, later
    assert list(a["draft_tokens"]) == list(b["draft_tokens"])
    scheduling = (b["schedule_end"] - b["schedule_start"]) - (
        a["schedule_end"] - a["schedule_start"]
    )
    drafted = (b["draft_tokens"] > 0).to_numpy()
    assert drafted.sum() > 10
    assert (scheduling[drafted] > 1e-4).all()  # 3 tokens of a third of a decode step each
    assert np.allclose(scheduling[~drafted], 0.0, atol=1e-9)
    assert paid.summary["tpot_ms"]["mean"] > free.summary["tpot_ms"]["mean"]


def test_draft_layers_go_with_self_only() -> None:
    with pytest.raises(ValueError, match="draft_layers goes with speculative self"):
        build_config(speculative="self", acceptance="0.5")
    with pytest.raises(ValueError, match="draft_layers goes with speculative self"):
        build_config(speculative="ngram", acceptance="0.5", draft_layers=4)
    with pytest.raises(ValueError, match="draft_layers takes 1 to 29 of smollm2-135m's 30"):
        build_config(model="smollm2-135m", speculative="self", acceptance="0.5", draft_layers=30)
