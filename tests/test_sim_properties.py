"""Property tests of the simulator against the scheduler core it drives.

For random small traces (with and without ``hash_ids``) and configurations (each
process layout included):
every request completes or is rejected with a reason, timestamps are ordered,
output lengths follow the trace, and replaying the simulator's recorded calls
on a fresh ``Scheduler`` gives the same plans, events and decode runs. Some
configurations speculate (drafts of 1 to 3 tokens, accepted at random rates).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.scheduler import POLICIES, PlaceholderDrafter
from schema.layouts import LAYOUTS
from schema.spill import SpilledSamples
from schema.traces import load_trace
from sim.config import build_config
from sim.model.calls import replay_calls
from sim.replay import run_replay

ORDERED = ("arrival", "tokenize_start", "tokenized", "sched_arrival", "first_scheduled",
           "first_token", "finished")  # fmt: skip


@st.composite
def traces(draw: st.DrawFn) -> list[dict[str, object]]:
    n = draw(st.integers(1, 12))
    with_hashes = draw(st.booleans())
    shared = draw(st.integers(0, 3))  # leading blocks common to many requests
    burst = draw(st.booleans())  # close arrivals, short prompts, long outputs: pages run out
    rows: list[dict[str, object]] = []
    t = 0.0
    for i in range(n):
        t += draw(st.floats(0, 0.01 if burst else 0.3))
        if burst:
            input_length = draw(st.integers(1, 100))
            output_length = draw(st.integers(40, 160))
        else:
            input_length = draw(st.integers(0, 1400) | st.integers(1, 100))
            output_length = draw(st.integers(0, 160) | st.integers(1, 3))
        row: dict[str, object] = {
            "timestamp": round(t * 1e3, 3),
            "input_length": input_length,
            "output_length": output_length,
            "priority": draw(st.integers(0, 2)),
        }
        if with_hashes:
            blocks = -(-input_length // 512)
            prefix = list(range(min(shared, blocks)))
            row["hash_ids"] = prefix + [1000 * (i + 1) + b for b in range(blocks - len(prefix))]
        rows.append(row)
    return rows


configs = st.fixed_dictionaries(
    {
        "num_pages": st.integers(4, 120),
        "max_running": st.integers(1, 8),
        "max_prefill_tokens": st.sampled_from([16, 64, 512, 8192]),
        "policy": st.sampled_from(sorted(POLICIES)),
        "prefix_cache": st.booleans(),
        "overlap": st.booleans(),
        "reserve_decode": st.booleans(),
        "fast_forward": st.booleans(),
        "num_tokenizers": st.integers(1, 3),
        "layout": st.sampled_from(LAYOUTS),
        "model": st.sampled_from(["smollm2-135m", "llama-3.1-8b"]),
        "speculative": st.sampled_from(["none", "ngram"]),
        "num_draft_tokens": st.integers(1, 3),
        "acceptance": st.sampled_from(["0", "1", "0.7", "0.9,0.5,0.2"]),
        "seed": st.integers(0, 3),
    }
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=traces(), config=configs)
def test_sim_drives_the_core_faithfully(
    tmp_path: Path, rows: list[dict[str, object]], config: dict[str, object]
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = load_trace(path)
    cfg = build_config(**config)
    result = run_replay(trace, cfg, record_calls=True, progress=False)
    req = result.requests

    assert len(req) == len(rows)
    assert set(req["status"]) <= {"completed", "rejected"}
    rejected = req[req["status"] == "rejected"]
    assert (rejected["reason"].str.len() > 0).all()
    done = req[req["status"] == "completed"]
    expected = {r.rid: r.output_length for r in trace.requests}
    assert [expected[rid] for rid in done["rid"]] == list(done["output_tokens"])
    for earlier, later in itertools.pairwise(ORDERED):
        assert (done[earlier].to_numpy() <= done[later].to_numpy()).all(), (earlier, later)
    assert (done["ttft_ms"] >= 0).all() and (done["e2e_ms"] >= done["ttft_ms"]).all()
    for r in trace.requests:  # a request the core can never hold is rejected, not dropped
        needs = -(-(r.input_length + r.output_length) // 16)
        if r.input_length > 0 and r.output_length > 0 and needs <= cfg.resolved_num_pages():
            assert r.rid in set(done["rid"])

    steps = result.steps
    gaps = np.diff(steps["step"])  # with overlap, a step with no model work has no row
    assert (gaps == 1).all() if not cfg.overlap else (gaps >= 1).all()
    assert (steps["kv_pages_used"] <= steps["kv_pages_total"]).all()
    assert isinstance(result.itl_s, SpilledSamples)
    itl = result.itl_s.load()
    assert (itl.values >= 0).all() and (itl.counts >= 1).all()

    calls = result.scheduler.calls
    assert sum(c.name == "add" for c in calls) == len(rows)
    drafter = PlaceholderDrafter() if cfg.speculating else None
    assert replay_calls(calls, cfg.scheduler_config(), drafter) == []
