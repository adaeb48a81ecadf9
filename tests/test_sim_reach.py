"""``cost_model.reach``: the largest steps a replay priced against the largest its profile
measured, the same however the loop runs them (single steps or fast-forwarded decode runs,
strict or overlapped, one replica or several)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.scheduler.plan import DecodeSlot, Plan, PrefillChunk
from core.scheduler.shape import StepShape
from lab.cli.sim import main
from sim.costs.reach import Reach, reach_summary, reach_warning

ROOT = Path(__file__).resolve().parents[1]
H200 = str(ROOT / "profiles" / "h200_llama-3.1-8b.csv")


def _trace(path: Path, prompt: int, output: int, n: int = 8) -> str:
    """``n`` requests of ``prompt`` and ``output`` tokens, 400 ms apart (timestamps in ms)."""
    rows = [{"timestamp": 400.0 * i, "input_length": prompt, "output_length": output}
            for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _reach(tmp_path: Path, trace: str, *flags: str) -> dict[str, Any]:
    out = tmp_path / "out"
    assert main(["replay", trace, "--profile", H200, "--no-report", "--no-progress",
                 "--out", str(out), *flags]) == 0  # fmt: skip
    reach: dict[str, Any] = json.loads((out / "summary.json").read_text())["cost_model"]["reach"]
    return reach


def test_a_step_widens_each_feature_to_its_largest() -> None:
    reach = Reach()
    plan = Plan(
        step=1,
        prefill=(PrefillChunk("a", 100, 50, True, (0,)),),
        decode=(DecodeSlot("b", 9, (1,)), DecodeSlot("c", 29, (2,))),
    )
    reach.widen(StepShape.of_plan(plan))
    assert reach.as_dict() == {
        "decode_batch": 2,
        "decode_longest": 30,
        "prefill_tokens": 50,
        "prefill_attention": 50 * 100 + 50 * 51 // 2,
    }
    reach.widen_run(1, 40)
    assert (reach.decode_batch, reach.decode_longest) == (2, 40)
    measured = Reach(4, 35, 64, 10_000)
    assert reach.beyond(measured) == {"decode_longest": 40}
    summary = reach_summary(measured, reach)
    assert summary is not None and summary["beyond"] == {"decode_longest": 40}
    warning = reach_warning(summary)
    assert warning is not None and "decode_longest 40 (1.14x the measured 35)" in warning
    assert reach_summary(None, reach) is None and reach_warning(None) is None


@pytest.mark.parametrize(
    "flags",
    [("--overlap",), ("--no-overlap",), ("--overlap", "--no-fast-forward"),
     ("--no-overlap", "--no-fast-forward"), ("--replicas", "2", "--router", "round_robin")],
)  # fmt: skip
def test_the_longest_decode_read_is_the_last_token_of_the_longest_request(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    reach = _reach(tmp_path, _trace(tmp_path / "t.jsonl", 17000, 40), *flags)
    assert reach["replayed"]["decode_longest"] == 17000 + 40 - 1
    assert reach["replayed"]["prefill_tokens"] == 8192  # the chunk budget's chunks
    assert reach["beyond"] == {"decode_longest": 17039}  # the H200 grid decodes up to 16,385


def test_a_replay_inside_the_grid_goes_beyond_nothing(tmp_path: Path) -> None:
    reach = _reach(tmp_path, _trace(tmp_path / "t.jsonl", 512, 16))
    assert reach["beyond"] == {} and reach["measured"]["decode_longest"] == 16385


def test_the_roofline_measured_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    trace = _trace(tmp_path / "t.jsonl", 512, 16)
    assert main(["replay", trace, "--cost-model", "roofline", "--no-report", "--no-progress",
                 "--out", str(out)]) == 0  # fmt: skip
    assert json.loads((out / "summary.json").read_text())["cost_model"]["reach"] is None
