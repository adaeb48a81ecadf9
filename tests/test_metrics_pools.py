"""``/metrics`` reports each replica's KV pool from the moment the server answers, before its
scheduler's first ``StatsUpdate``: ``sim validate`` and ``engine bench`` read the pool there."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from engine.ipc.config import ServeConfig
from engine.runner.args import RunnerArgs
from engine.server.app import create_app
from lab.bench.server import metric_value


def samples(text: str, name: str) -> dict[str, float]:
    """The samples of ``name`` by their ``replica`` label."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            replica = labels.split('replica="', 1)[1].split('"', 1)[0]
            out[replica] = float(value)
    return out


def test_pool_sizes_are_in_metrics_before_any_stats(tmp_path: Path) -> None:
    names: dict[str, Any] = {"model": "m", "runner": RunnerArgs(model="m"), "tokenizer_path": ""}
    cfg = ServeConfig(**names, vocab_size=256, run_dir=str(tmp_path), parent_pid=os.getpid(),
                      max_model_len=1024, dp_size=2)  # fmt: skip
    pools = {0: (256, 0), 1: (300, 64)}
    with TestClient(create_app(cfg, health=lambda: None, pools=pools)) as client:
        text = client.get("/metrics").text
    assert samples(text, "engine_kv_pages_total") == {"0": 256.0, "1": 300.0}
    assert samples(text, "engine_kv_host_pages_total") == {"0": 0.0, "1": 64.0}
    assert samples(text, "engine_kv_pages_used") == {"0": 0.0, "1": 0.0}
    assert metric_value(text, "engine_kv_pages_total") == 256.0
