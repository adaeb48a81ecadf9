"""``sim trace conversations``: whole conversations kept, lines unchanged, in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.cli.sim import main as sim_main
from schema.traces import load_trace
from schema.traces.conversations import conversation_key, sample


def line(t: float, conv: int, turn: int) -> str:
    """A request of conversation ``conv``: the shared block 0, the conversation's block,
    then one block per earlier turn (a turn's prompt holds the conversation so far)."""
    ids = [0, 1000 + conv] + [10_000 * conv + k for k in range(turn)]
    return json.dumps({"timestamp": t, "input_length": 512 * len(ids), "output_length": 8,
                       "hash_ids": ids}) + "\n"  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    turns=st.lists(st.integers(1, 4), min_size=1, max_size=12),
    fraction=st.floats(0.05, 1.0),
    seed=st.integers(0, 5),
)
def test_sample_keeps_whole_conversations_in_order(
    turns: list[int], fraction: float, seed: int
) -> None:
    lines = [line(float(i), c, k) for i, (c, k) in enumerate(
        (c, k) for c, n in enumerate(turns) for k in range(n))]  # fmt: skip
    lines.sort(key=lambda s: json.loads(s)["timestamp"])
    kept = sample(lines, fraction, seed, key_blocks=2, keep_single=False)
    assert kept == [x for x in lines if x in kept]  # order and text unchanged
    kept_convs = {conversation_key(x, 2) for x in kept}
    for conv in kept_convs:  # every turn of a kept conversation, and never a single
        whole = [x for x in lines if conversation_key(x, 2) == conv]
        assert len(whole) > 1 and all(x in kept for x in whole)
    if fraction == 1.0:
        assert len(kept) == sum(n for n in turns if n > 1)
    with_single = sample(lines, 1.0, seed, key_blocks=2, keep_single=True)
    assert with_single == lines
    # --max-input: only conversations whose every prompt fits (turn k's prompt: 512 (k + 2))
    fitting = sample(lines, fraction, seed, key_blocks=2, keep_single=False, max_input=1536)
    assert all(json.loads(x)["input_length"] <= 1536 for x in fitting)
    assert {conversation_key(x, 2) for x in fitting} <= {conversation_key(x, 2) for x in lines}
    if fraction == 1.0:  # conversations of two turns exactly: prompts of 1,024 and 1,536
        assert len(fitting) == 2 * sum(1 for n in turns if n == 2)


def test_command_writes_a_trace_the_reader_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "conv.jsonl"
    src.write_text("".join(line(5000.0 + 100 * i + c, c, i) for i in range(3) for c in range(20)))
    out = tmp_path / "sample.jsonl"
    command = ["trace", "conversations", str(src), "--fraction", "0.5", "--seed", "3"]
    assert sim_main([*command, "--out", str(out)]) == 0
    requests = load_trace(out).requests
    assert f"wrote {len(requests)} requests" in capsys.readouterr().out
    assert 0 < len(requests) < 60 and len(requests) % 3 == 0  # whole conversations of 3
    assert requests[0].arrival == 0.0  # timestamps moved: the first kept request at 0
    source = {(r.input_length, r.hash_ids): r.arrival for r in load_trace(src).requests}
    start = source[requests[0].input_length, requests[0].hash_ids]
    moved = [source[r.input_length, r.hash_ids] - start for r in requests]
    assert [r.arrival for r in requests] == pytest.approx(moved)
    for bad, why in (
        ([str(tmp_path / "t.csv"), "--fraction", "0.5"], "a .jsonl trace"),
        ([str(tmp_path / "none.jsonl"), "--fraction", "0.5"], "no such trace file"),
        ([str(src), "--fraction", "1.5"], "need 0 < --fraction <= 1"),
    ):
        assert sim_main(["trace", "conversations", *bad, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("sim trace conversations: error: ") and why in err
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()
