"""Trace readers: both formats parse as published; malformed lines name their line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from schema.traces import TraceError, generate, load_trace
from schema.traces.azure import parse_azure_timestamp

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_real_traces_parse_with_expected_rows() -> None:
    conv = load_trace(ROOT / "traces" / "azure_conv.csv", limit=50)
    assert conv.format == "azure-csv" and len(conv.requests) == 50
    assert conv.requests[0].arrival == 0.0
    assert conv.requests[0].input_length == 374 and conv.requests[0].output_length == 44
    assert conv.requests[1].arrival == pytest.approx(4.314579, abs=1e-9)
    moon = load_trace(ROOT / "traces" / "mooncake_conversation.jsonl", limit=20)
    assert moon.format == "jsonl"
    first = moon.requests[0]
    assert (first.input_length, first.output_length) == (6758, 500)
    assert first.hash_ids[:3] == (0, 1, 2) and len(first.hash_ids) == 14


def test_azure_timestamps_are_exact_ticks() -> None:
    a = parse_azure_timestamp("2023-11-16 18:17:03.9799600")
    b = parse_azure_timestamp("2023-11-16 18:17:04.0319600")
    assert b - a == 520_000  # 52 ms in 100 ns ticks


def test_jsonl_fields_and_defaults(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1500, "input_length": 10, "output_length": 3, "rid": "a", "priority": 2},
        {"timestamp": 0, "input_length": 5, "output_length": 1, "prompt": "hi"},
    ]
    path = _write(tmp_path / "t.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    trace = load_trace(path)
    assert [r.rid for r in trace.requests] == ["L2", "a"]  # sorted by arrival
    assert trace.requests[1].arrival == 1.5 and trace.requests[1].priority == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"timestamp": 0, "input_length": 3}', "missing field 'output_length'"),
        ('{"timestamp": 0, "input_length": -1, "output_length": 2}', "must be >= 0"),
        ('{"timestamp": "x", "input_length": 1, "output_length": 2}', "'timestamp'"),
        ('{"timestamp": 0, "input_length": 1.5, "output_length": 2}', "must be an integer"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 2, "hash_ids": [1, "a"]}',
         "hash_ids"),
        ("[1, 2]", "expected a JSON object"),
    ],
)  # fmt: skip
def test_jsonl_malformed_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    good = '{"timestamp": 0, "input_length": 3, "output_length": 2}'
    path = _write(tmp_path / "bad.jsonl", f"{good}\n{good}\n{line}\n")
    with pytest.raises(TraceError, match=message) as info:
        load_trace(path)
    assert info.value.line == 3 and f"{path}:3" in str(info.value)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2023-11-16 18:15:47.1,12", "expected 3 columns"),
        ("yesterday,12,3", "bad TIMESTAMP"),
        ("2023-11-16 18:15:47.1,twelve,3", "ContextTokens must be an integer"),
        ("2023-11-16 18:15:47.1,12,-3", "GeneratedTokens must be >= 0"),
        ("2023-11-16 18:15:45.0,12,3", "earlier than the first row"),
    ],
)
def test_azure_malformed_row_names_line(tmp_path: Path, row: str, message: str) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
    path = _write(tmp_path / "bad.csv", text + row + "\n")
    with pytest.raises(TraceError, match=message) as info:
        load_trace(path)
    assert info.value.line == 3


def test_azure_bad_header_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="expected header"):
        load_trace(_write(tmp_path / "h.csv", "time,in,out\n1,2,3\n"))
    with pytest.raises(TraceError, match="no requests"):
        load_trace(_write(tmp_path / "e.jsonl", "\n"))
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(_write(tmp_path / "x.txt", "1"))


def test_duplicate_rid_is_an_error(tmp_path: Path) -> None:
    row = '{"timestamp": 0, "input_length": 3, "output_length": 2, "rid": "x"}'
    with pytest.raises(TraceError, match="duplicate rid 'x' \\(first on line 1\\)"):
        load_trace(_write(tmp_path / "d.jsonl", f"{row}\n{row}\n"))


def test_zero_lengths_are_kept_for_the_replay_to_report(tmp_path: Path) -> None:
    rows = '{"timestamp": 0, "input_length": 0, "output_length": 2}\n'
    rows += '{"timestamp": 5, "input_length": 4, "output_length": 0}\n'
    trace = load_trace(_write(tmp_path / "z.jsonl", rows))
    assert [(r.input_length, r.output_length) for r in trace.requests] == [(0, 2), (4, 0)]


def test_rate_scale_and_limit() -> None:
    base = load_trace(ROOT / "traces" / "azure_code.csv", limit=100)
    fast = load_trace(ROOT / "traces" / "azure_code.csv", limit=100, rate_scale=4.0)
    assert len(base.requests) == 100
    for a, b in zip(base.requests, fast.requests, strict=True):
        assert b.arrival == pytest.approx(a.arrival / 4.0)
        assert (a.input_length, a.output_length) == (b.input_length, b.output_length)
    with pytest.raises(ValueError, match="rate_scale"):
        load_trace(ROOT / "traces" / "azure_code.csv", rate_scale=0)


@pytest.mark.parametrize("arrival", ["poisson", "gamma"])
def test_generator_is_seeded_and_matches_its_rate(tmp_path: Path, arrival: str) -> None:
    kw = dict(arrival=arrival, rate=20.0, input_spec="uniform:10:20", output_spec="fixed:7",
              num=2000, seed=3, cv=2.0)  # fmt: skip
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    generate(a, **kw)  # type: ignore[arg-type]
    generate(b, **kw)  # type: ignore[arg-type]
    assert a.read_text() == b.read_text()
    trace = load_trace(a)
    arrivals = np.array([r.arrival for r in trace.requests])
    assert len(arrivals) / arrivals[-1] == pytest.approx(20.0, rel=0.15)
    assert {r.output_length for r in trace.requests} == {7}
    assert all(10 <= r.input_length <= 20 for r in trace.requests)
    gaps = np.diff(arrivals)
    cv = gaps.std() / gaps.mean()
    assert cv == pytest.approx(1.0 if arrival == "poisson" else 2.0, rel=0.2)


def test_generator_empirical_lengths_come_from_the_trace(tmp_path: Path) -> None:
    src = ROOT / "traces" / "azure_code.csv"
    out = tmp_path / "e.jsonl"
    generate(out, arrival="poisson", rate=1.0, input_spec=f"empirical:{src}",
             output_spec=f"empirical:{src}", num=200, seed=1)  # fmt: skip
    real = load_trace(src)
    inputs = {r.input_length for r in real.requests}
    assert all(r.input_length in inputs for r in load_trace(out).requests)
    with pytest.raises(ValueError, match="bad length spec"):
        generate(out, arrival="poisson", rate=1.0, input_spec="normal:3", output_spec="fixed:1",
                 num=2, seed=0)  # fmt: skip


def test_generated_prefixes_share_whole_blocks_within_a_group(tmp_path: Path) -> None:
    out = tmp_path / "prefixed.jsonl"
    generate(
        out, arrival="poisson", rate=2.0, input_spec="uniform:100:6000", output_spec="fixed:8",
        num=300, seed=3, prefix_groups=4, prefix_len="uniform:1024:4096",
    )  # fmt: skip
    requests = load_trace(out).requests
    firsts: dict[int, list[tuple[int, ...]]] = {}
    seen_own: set[int] = set()
    for r in requests:
        assert len(r.hash_ids) == -(-r.input_length // 512)
        if r.input_length >= 4096:  # long enough for any group's whole prefix (<= 8 blocks)
            firsts.setdefault(r.hash_ids[0], []).append(r.hash_ids)
    assert 2 <= len(firsts) <= 4  # the groups' first blocks
    for prompts in firsts.values():
        shared = min(len(p) for p in prompts)
        common = next(
            i for i in range(shared + 1) if i == shared or len({p[i] for p in prompts}) > 1
        )
        assert 2 <= common <= 8  # 1024-4096 tokens: 2 to 8 whole blocks
        for p in prompts:
            own = p[common:]
            assert not seen_own & set(own)  # a block past the shared prefix is the prompt's own
            seen_own |= set(own)
    with pytest.raises(ValueError, match="prefix groups"):
        generate(out, arrival="poisson", rate=1.0, input_spec="fixed:10", output_spec="fixed:1",
                 num=2, seed=0, prefix_groups=-1)  # fmt: skip
