"""The simulator's process layouts (``SimConfig.layout``): which process each stage holds.

- ``split`` is the pipeline as it was (``tests/test_sim_streaming.py`` pins it);
- ``frontend`` pays no IPC hop to or from a tokenizer or detokenizer process;
- ``inline`` tokenizes in the scheduler's loop: a long prompt arriving mid-decode
  delays the running request's next token by its tokenization time.
Every layout completes or rejects every request (``tests/test_sim_properties.py``
draws the layout) and fast-forwards as it steps (``tests/test_sim_replay.py``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lab.bench.server import ServerInfo
from schema.layouts import LAYOUTS
from schema.traces import Trace, load_trace
from sim.config import build_config
from sim.replay import ReplayResult, build_costs, run_replay

ROOT = Path(__file__).resolve().parents[1]
LONG_PROMPT = 32_000  # B's prompt: ~0.19 s to tokenize at the H200 profile's 5.9 us a token


def _trace(tmp_path: Path, rows: list[dict[str, Any]]) -> Trace:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_trace(path)


def _replay(trace: Trace, **config: Any) -> ReplayResult:
    return run_replay(trace, build_config(**config), progress=False)


def test_the_layout_is_a_setting_with_split_by_default() -> None:
    assert build_config().layout == "split"
    assert build_config(layout="inline").to_dict()["layout"] == "inline"
    with pytest.raises(ValueError, match="unknown layout"):
        build_config(layout="fused")


@pytest.mark.parametrize("layout", ["frontend", "inline"])
def test_one_hop_each_way_instead_of_two(tmp_path: Path, layout: str) -> None:
    """A lone request: ``frontend`` and ``inline`` skip the hop to a tokenizer worker and the
    hop to a detokenizer process, so its TTFT and E2E are two IPC hops shorter than ``split``'s."""
    trace = _trace(tmp_path, [{"timestamp": 0, "input_length": 500, "output_length": 4}])
    ipc = build_costs(build_config())[1].ipc
    split = _replay(trace).requests.iloc[0]
    other = _replay(trace, layout=layout).requests.iloc[0]
    for column in ("ttft_ms", "e2e_ms"):
        assert split[column] - other[column] == pytest.approx(2 * ipc * 1e3, abs=1e-6)
    if layout == "frontend":  # tokenized on the frontend's process, then one hop
        assert other["tokenizer_queue_ms"] == 0
        assert other["sched_arrival"] - other["tokenized"] == pytest.approx(ipc)
        assert split["sched_arrival"] - split["tokenized"] == pytest.approx(ipc)
        assert split["tokenize_start"] - other["tokenize_start"] == pytest.approx(ipc)


def _long_gaps_s(result: ReplayResult) -> float:
    """The inter-token gaps of the run longer than 50 ms, summed (B streams one token: all
    gaps are A's; A's decode steps take a few ms)."""
    itl = result.itl_s.load()
    long = itl.values > 0.05
    return float((itl.values[long] * itl.counts[long]).sum())


@pytest.mark.parametrize("overlap", [False, True])
def test_inline_tokenization_delays_the_running_decode(tmp_path: Path, overlap: bool) -> None:
    """A decodes; B's long prompt arrives mid-decode. Inline, the scheduler's loop tokenizes B
    before it launches A's next step: A's gaps around B's arrival (its prefill's, in one chunk
    here, and strict, the same gap; with overlap, the gap before it, as the loop completes
    the step in flight after it tokenized) grow by B's tokenization time, and no step starts
    while B is tokenized but the one already in flight."""
    rows = [
        {"timestamp": 0, "input_length": 200, "output_length": 1500},
        {"timestamp": 2000, "input_length": LONG_PROMPT, "output_length": 1},
    ]
    trace = _trace(tmp_path, rows)
    tokenize = build_costs(build_config())[1].tokenize * LONG_PROMPT
    one_chunk = {"overlap": overlap, "max_prefill_tokens": LONG_PROMPT}  # B's prefill: one step
    split = _replay(trace, **one_chunk)
    inline = _replay(trace, **one_chunk, layout="inline")
    grown = _long_gaps_s(inline) - _long_gaps_s(split)
    assert tokenize * 0.95 <= grown <= tokenize * 1.05
    b = inline.requests.set_index("rid").iloc[1]
    assert b["tokenized"] - b["tokenize_start"] == pytest.approx(tokenize)
    starts = inline.steps["time"].to_numpy()
    during = (starts > b["tokenize_start"]) & (starts < b["tokenized"])
    assert during.sum() <= (1 if overlap else 0)
    for result in (split, inline):
        assert set(result.requests["status"]) == {"completed"}


def test_validate_simulates_the_layout_on_the_card() -> None:
    import argparse

    from lab.validate.command import add_validate_args, sim_config

    profile = ROOT / "profiles" / "cpu-xeon-2core_smollm2-135m.csv"
    parser = argparse.ArgumentParser()
    add_validate_args(parser.add_subparsers())
    args = parser.parse_args(["validate", "t.jsonl", "--url", "http://x", "--profile",
                              str(profile), "--out", "o", "--model", "smollm2-135m"])  # fmt: skip
    card = ServerInfo("http://x", "smollm2-135m", "engine", None, None, 64, False)
    assert sim_config(args, card, 64).layout == "split"  # a card without the field
    assert sim_config(args, replace(card, layout="inline"), 64).layout == "inline"


def test_the_verdict_still_names_the_tokenizer_in_split(tmp_path: Path) -> None:
    """Long prompts at a rate one tokenizer worker cannot keep up with (~4.7 ms each at the
    committed CPU costs, one every 2 ms, to a small model): the verdict names the tokenizer in
    ``split``; with four workers it does not."""
    from lab.report import bottleneck_verdict

    rows = [{"timestamp": 2.0 * i, "input_length": 4000, "output_length": 8} for i in range(200)]
    trace = _trace(tmp_path, rows)
    limits = {}
    for layout, workers in (("split", 1), ("split", 4)):
        r = _replay(trace, model="smollm2-135m", layout=layout, num_tokenizers=workers)
        limits[layout, workers] = bottleneck_verdict(r.summary, r.requests, r.steps, r.queues)
    assert limits["split", 1]["binding_limit"] == "tokenizer"
    assert limits["split", 4]["binding_limit"] != "tokenizer"


def test_layouts_are_sweepable_knobs() -> None:
    from lab.sweep.grid import check_grid, expand

    grid = check_grid({"layout": list(LAYOUTS), "num_tokenizers": [1, 2]})
    configs = [build_config(**point) for point in expand(grid)]
    assert [(c.layout, c.num_tokenizers) for c in configs][:2] == [("split", 1), ("split", 2)]
    assert len(configs) == 6
    assert np.unique([c.layout for c in configs]).tolist() == sorted(LAYOUTS)
