"""Speculative decoding replayed: steps, acceptance and drafts through the simulated loop, strict
and overlapped (with overlap a verify step completes before the next step is formed, as in
the engine's loop, so the running requests never split into groups that verify in turn)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from core.scheduler import PlaceholderDrafter
from engine.speculative import DEFAULT_DRAFT_TOKENS, METHODS
from schema.steprecord import SPECULATIVE_COLUMNS, read_step_record
from schema.traces import load_trace
from sim.config import DEFAULT_DRAFT_TOKENS as SIM_DEFAULT_DRAFT_TOKENS
from sim.config import SPECULATIVE_METHODS, build_config
from sim.costs.acceptance_files import load_acceptance
from sim.model.calls import replay_calls
from sim.replay import run_replay

PROFILE = "profiles/cpu-xeon-2core_smollm2-135m.csv"


def tiny_trace(tmp_path: Path, n: int = 1, output: int = 41, gap_ms: float = 0.0):  # type: ignore[no-untyped-def]
    path = tmp_path / f"trace{n}_{output}.jsonl"
    rows = [
        {"timestamp": i * gap_ms, "input_length": 64, "output_length": output} for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_trace(path)


def replay(trace, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("overlap", False)
    cfg = build_config(model="smollm2-135m", profile=PROFILE, **kw)
    return run_replay(trace, cfg, progress=False, record_calls=True)


def test_a_step_record_gives_one_rate_by_its_sums(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path, n=6, output=40)
    cfg = build_config(model="smollm2-135m", profile=PROFILE, speculative="ngram",
                       acceptance="0.7", num_draft_tokens=3)  # fmt: skip
    result = run_replay(trace, cfg, progress=False, record_steps=True)
    record = result.engine_steps
    assert record is not None and list(record.columns[-2:]) == list(SPECULATIVE_COLUMNS)
    path = tmp_path / "engine_steps.csv"
    record.to_csv(path, index=False)
    frame = read_step_record(path)  # the engine's schema reads the simulator's record
    assert frame["draft_tokens"].sum() == result.summary["speculative"]["draft_tokens"]
    model = load_acceptance(str(path), 3)
    assert model.geometric and model.rates[0] == pytest.approx(0.7, abs=0.1)
    no_drafts = tmp_path / "plain.csv"
    record.drop(columns=list(SPECULATIVE_COLUMNS)).to_csv(no_drafts, index=False)
    with pytest.raises(ValueError, match="not a speculating engine's"):
        load_acceptance(str(no_drafts), 3)


@pytest.mark.parametrize("overlap", [False, True])
def test_full_acceptance_decodes_k_plus_one_tokens_a_step(tmp_path: Path, overlap: bool) -> None:
    out, k = 41, 4
    trace = tiny_trace(tmp_path, output=out)
    plain = replay(trace, overlap=overlap)
    fast = replay(trace, speculative="ngram", acceptance="1", num_draft_tokens=k, overlap=overlap)
    assert list(fast.requests["output_tokens"]) == [out]
    # the prefill samples the first token; each verify step then gives k + 1 (the draft
    # limit shortens the last); with overlap a request with a draft in flight sits out a step
    verify = math.ceil((out - 1) / (k + 1))
    assert len(fast.steps) == 1 + verify
    assert len(plain.steps) == out
    summary = fast.summary["speculative"]
    assert summary["acceptance_rate"] == 1.0 and summary["verify_slots"] == verify
    assert summary["undrafted_slots"] == 0 and summary["acceptance"]["draft_share"] == 1.0
    # a step's tokens reach the client in one chunk: ITL has a gap per step, not per token
    assert fast.itl_s.load().counts.sum() == verify
    assert plain.itl_s.load().counts.sum() == out - 1
    assert fast.summary["tpot_ms"]["mean"] < plain.summary["tpot_ms"]["mean"]


def test_no_acceptance_takes_as_many_steps_as_plain_decoding(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path, n=3, output=30, gap_ms=5.0)
    plain = replay(trace)
    none = replay(trace, speculative="ngram", acceptance="0", num_draft_tokens=3)
    assert len(none.steps) == len(plain.steps)
    assert list(none.requests["output_tokens"]) == list(plain.requests["output_tokens"])
    assert none.summary["speculative"]["accepted_tokens"] == 0
    drafted = none.steps["step"].isin(
        [c.args[0] for c in none.scheduler.calls if c.name == "complete" and len(c.args) > 1]
    )
    assert drafted.sum() > 0


@pytest.mark.parametrize("overlap", [False, True])
def test_no_draft_share_is_the_plain_replay(tmp_path: Path, overlap: bool) -> None:
    trace = tiny_trace(tmp_path, n=3, output=30, gap_ms=5.0)
    plain = replay(trace, overlap=overlap)
    kw = {"speculative": "ngram", "acceptance": "0.8", "num_draft_tokens": 3}
    none = replay(trace, draft_share=0.0, overlap=overlap, **kw)
    assert len(none.steps) == len(plain.steps)
    assert none.steps["prefill_tokens"].sum() == plain.steps["prefill_tokens"].sum()
    assert list(none.requests["output_tokens"]) == list(plain.requests["output_tokens"])
    summary = none.summary["speculative"]
    assert summary["verify_slots"] == 0 and summary["undrafted_slots"] > 0


def test_half_the_slots_carry_a_draft(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path, n=20, output=40, gap_ms=5.0)
    kw = {"speculative": "ngram", "acceptance": "0", "num_draft_tokens": 2, "seed": 7}
    half = replay(trace, draft_share=0.5, **kw).summary["speculative"]
    slots = half["verify_slots"] + half["undrafted_slots"]
    assert slots > 500
    assert abs(half["verify_slots"] / slots - 0.5) < 0.08  # ~4.5 standard deviations
    again = replay(trace, draft_share=0.5, **kw).summary["speculative"]
    assert again["verify_slots"] == half["verify_slots"]  # deterministic
    full = replay(trace, **kw).summary["speculative"]
    assert full["undrafted_slots"] == 0 and full["verify_slots"] > half["verify_slots"]


def test_overlap_drafts_one_stream_as_often_as_strict_steps(tmp_path: Path) -> None:
    # with overlap a plain slot placed while the request's previous slot is in flight has the
    # same output length as that one: drawn by it, a plain slot after a verify step made the
    # next plain too, and one stream at a share of 0.5 drafted about 0.4 of its slots
    trace = tiny_trace(tmp_path, n=1, output=400)
    kw = {"speculative": "ngram", "acceptance": "0.3", "num_draft_tokens": 4, "seed": 7,
          "draft_share": 0.5}  # fmt: skip
    shares = []
    for overlap in (False, True):
        spec = replay(trace, overlap=overlap, **kw).summary["speculative"]
        slots = spec["verify_slots"] + spec["undrafted_slots"]
        assert slots > 250
        shares.append(spec["verify_slots"] / slots)
    assert abs(shares[0] - 0.5) < 0.09  # ~3 standard deviations
    assert abs(shares[1] - shares[0]) < 0.03


def test_verify_steps_are_priced_as_the_extends_they_are(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path, n=3, output=30, gap_ms=5.0)
    plain = replay(trace)
    none = replay(trace, speculative="ngram", acceptance="0", num_draft_tokens=3)
    assert len(none.steps) == len(plain.steps)
    # a slot with 3 drafts is an extend of 4 tokens: prefill tokens, dearer than a decode
    assert none.steps["prefill_tokens"].sum() > plain.steps["prefill_tokens"].sum()
    assert none.steps["duration_s"].sum() > plain.steps["duration_s"].sum()
    assert none.summary["tpot_ms"]["mean"] > plain.summary["tpot_ms"]["mean"]


def test_speculation_off_is_the_plain_replay(tmp_path: Path) -> None:
    """No drafter, whatever num_draft_tokens says (as the engine without --speculative)."""
    trace = load_trace("traces/mooncake_conversation.jsonl", limit=60, rate_scale=4.0)
    for kw in ({}, {"overlap": True}, {"replicas": 2}):
        a = run_replay(trace, build_config(**kw), progress=False)
        b = run_replay(trace, build_config(num_draft_tokens=4, acceptance="0.5", **kw),
                       progress=False)  # fmt: skip
        for s in (a.summary, b.summary):
            s.pop("wall_s")
            s.pop("config")
        assert a.summary == b.summary
        assert a.summary["speculative"] == {"method": "none"}


def test_speculating_config_is_checked() -> None:
    cfg = build_config(speculative="ngram", acceptance="0.5")
    assert cfg.num_draft_tokens == SIM_DEFAULT_DRAFT_TOKENS  # as engine serve's
    with pytest.raises(ValueError, match="needs an acceptance model"):
        build_config(speculative="ngram")
    with pytest.raises(ValueError, match="needs num_draft_tokens >= 1"):
        build_config(speculative="ngram", acceptance="0.5", num_draft_tokens=0)
    with pytest.raises(ValueError, match="covers 2 draft positions"):
        build_config(speculative="ngram", acceptance="0.5,0.4", num_draft_tokens=3)
    with pytest.raises(ValueError, match="unknown speculative"):
        build_config(speculative="eagle", acceptance="0.5")


def test_the_simulators_methods_are_the_engines() -> None:
    assert SPECULATIVE_METHODS == METHODS
    assert SIM_DEFAULT_DRAFT_TOKENS == DEFAULT_DRAFT_TOKENS


def test_sim_replay_flags_match_engine_serve(tmp_path: Path) -> None:
    from lab.cli.sim import build_parser

    out = tmp_path / "out"
    args = build_parser().parse_args([
        "replay", "traces/azure_code.csv", "--limit", "5", "--out", str(out), "--no-report",
        "--no-progress", "--speculative", "ngram", "--num-draft-tokens", "2",
        "--acceptance", "0.8,0.4", "--seed", "3", "--record-steps",
    ])  # fmt: skip
    assert args.func(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["speculative"]["method"] == "ngram"
    assert summary["speculative"]["num_draft_tokens"] == 2
    assert summary["config"]["acceptance"] == "0.8,0.4" and summary["config"]["seed"] == 3
    record = pd.read_csv(out / "engine_steps.csv")
    assert record["accepted_tokens"].sum() == summary["speculative"]["accepted_tokens"]


@pytest.mark.parametrize("overlap", [False, True])
def test_replaying_the_calls_gives_the_same_plans(tmp_path: Path, overlap: bool) -> None:
    trace = tiny_trace(tmp_path, n=5, output=50, gap_ms=3.0)
    result = replay(trace, speculative="ngram", acceptance="0.9,0.6,0.3", num_draft_tokens=3,
                    overlap=overlap, seed=4)  # fmt: skip
    assert (result.requests["output_tokens"] == 50).all()
    calls = result.scheduler.calls
    assert any(c.name == "complete" and len(c.args) > 1 for c in calls)
    assert replay_calls(calls, result.scheduler.config, PlaceholderDrafter()) == []


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
        model="smollm2-135m", profile=PROFILE, overlap=True, speculative="ngram",
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
