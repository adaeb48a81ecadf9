"""``sim trace window``: a row window of a trace, in its own format, that the reader takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.cli.sim import main as sim_main
from schema.traces import load_trace

TRACES = Path(__file__).resolve().parents[1] / "traces"


def window(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``sim trace window ARGS``: its exit status, stdout and stderr."""
    code = sim_main(["trace", "window", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", ["azure_code.csv", "mooncake_conversation.jsonl"])
def test_a_window_is_the_rows_asked_for_starting_at_zero(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = TRACES / name
    out = tmp_path / f"window{source.suffix}"
    code, printed, err = window(capsys, source, "--skip", 40, "--limit", 25, "--out", out)
    assert code == 0, err
    assert printed == f"wrote requests 40..64 of {source} to {out}\n"
    whole = load_trace(source).requests
    cut = load_trace(out).requests
    assert len(cut) == 25 and cut[0].arrival == 0.0
    assert [(r.input_length, r.output_length) for r in cut] == [
        (r.input_length, r.output_length) for r in whole[40:65]
    ]
    start = whole[40].arrival
    assert [r.arrival for r in cut] == pytest.approx([r.arrival - start for r in whole[40:65]])
    lines = source.read_text().splitlines()
    if source.suffix == ".csv":  # header and rows unchanged
        assert out.read_text().splitlines() == lines[:1] + lines[41:66]
        return
    first = json.loads(lines[40])["timestamp"]
    assert first > 0  # every field but the timestamp as it was, the timestamp less the first's
    shifted = [json.loads(x) | {"timestamp": json.loads(x)["timestamp"] - first} for x in lines]
    assert [json.loads(x) for x in out.read_text().splitlines()] == shifted[40:65]


def test_a_window_past_the_end_or_a_bad_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = tmp_path / "small.jsonl"
    small.write_text('{"timestamp": 0, "input_length": 8, "output_length": 2}\n' * 3)
    (tmp_path / "t.txt").write_text("a trace of no known format\n")
    out = tmp_path / "w.jsonl"
    for args, why in (
        ([small, "--skip", 2, "--limit", 2], "3 requests, fewer than skip + limit"),
        ([small, "--skip", -1, "--limit", 2], "need --skip >= 0"),
        ([tmp_path / "none.csv", "--limit", 2], "no such trace file"),
        ([tmp_path / "t.txt", "--limit", 2], "unknown trace format"),
    ):
        code, printed, err = window(capsys, *args, "--out", out)
        assert code == 2 and not printed and len(err.splitlines()) == 1
        assert err.startswith("sim trace window: error: ") and why in err
    assert not out.exists()
