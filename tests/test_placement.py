"""``comparison["placement"]``: where the router put each request, real against simulated."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab.validate.placement import format_placement, placement, same_replica


def frame(replicas: list[float], output: int = 10) -> pd.DataFrame:
    n = len(replicas)
    return pd.DataFrame(
        {
            "rid": [f"r{i}" for i in range(n)],
            "status": ["completed"] * n,
            "input_tokens": [100] * n,
            "cached_tokens": [40] * n,
            "output_tokens": [output] * n,
            "ttft_ms": np.linspace(10, 20, n),
            "tpot_ms": np.linspace(1, 2, n),
            "replica": replicas,
        }
    )


def test_replicas_are_matched_by_name_up_to_a_renaming() -> None:
    """A round robin that started on the other replica places every request alike; one
    request of four elsewhere is 75 %."""
    sim = frame([0, 1, 0, 1])
    assert same_replica(frame([1, 0, 1, 0]), sim) == 1.0
    assert same_replica(frame([1, 0, 1, 1]), sim) == 0.75
    assert same_replica(frame([np.nan] * 4), sim) is None  # a server that does not say


def test_the_block_holds_each_world_s_work_per_replica() -> None:
    real, sim = frame([0, 0, 0, 1]), frame([0, 1, 0, 1], output=20)
    block = placement([real], sim)
    assert block is not None
    assert block["replicas"]["0"]["real_runs"][0]["requests"] == 3
    assert block["replicas"]["0"]["sim"] == {
        "requests": 2, "output_tokens": 40, "uncached_tokens": 120,
        "ttft_ms_p50": float(np.median(sim["ttft_ms"][[0, 2]])),
        "tpot_ms_p50": float(np.median(sim["tpot_ms"][[0, 2]])),
    }  # fmt: skip
    assert block["same_replica"] == [0.75]
    assert "replica 1: 1 / 2" in format_placement(block)
    assert placement([real], frame([0, 0, 0, 0])) is None  # one replica: nothing to place
