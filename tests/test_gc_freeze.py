"""Every process of ``engine serve`` freezes its start-up heap out of garbage collection once it
is ready (``--no-gc-freeze`` turns it off), and so does ``engine bench`` for its measured run."""

from __future__ import annotations

import gc
import json
import re
from pathlib import Path

import pytest
from conftest import Server, running_server

from lab.bench.main import bench_main

pytestmark = pytest.mark.slow
FROZE = re.compile(r" (\w+) INFO engine\.ipc\.heap: gc: froze (\d+) start-up objects")


def frozen_by_process(log: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in FROZE.finditer(log)}


def test_every_server_process_freezes_its_heap(server: Server) -> None:
    assert server.metrics()["engine_gc_frozen_objects"] > 10_000  # the frontend's, now
    frozen = frozen_by_process(server.log())
    assert {"tokenizer0", "scheduler0", "detokenizer0"} <= frozen.keys()
    assert len(frozen) == 4 and min(frozen.values()) > 10_000  # and the frontend's line


def test_no_gc_freeze_leaves_the_collector_as_it_was(model_ready: str) -> None:
    with running_server("--num-pages", "64", "--no-gc-freeze") as s:
        assert s.metrics()["engine_gc_frozen_objects"] == 0
        assert frozen_by_process(s.log()) == {}


def test_bench_freezes_for_the_measured_run_only(server: Server, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 20, "output_length": 2}) + "\n")
    argv = [str(trace), "--url", server.url, "--no-report", "--no-progress"]
    assert gc.get_freeze_count() == 0
    for flags, frozen in (([], True), (["--no-gc-freeze"], False)):
        out = tmp_path / str(frozen)
        assert bench_main([*argv, *flags, "--out", str(out)]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert (summary["bench"]["gc_frozen_objects"] > 10_000) is frozen
        assert gc.get_freeze_count() == 0  # unfrozen after the run
