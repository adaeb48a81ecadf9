"""The arithmetic of ``comparison.json``: relative errors, run-to-run noise, targets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.validate.compare import (
    LATENCIES,
    STATS,
    TARGET_KEYS,
    TTFT_PARTS,
    compare,
    format_comparison,
    lookup,
    noise,
    relative_error,
    ttft_parts,
)


def summary(scale: float, tpot_p90: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        m: {q: scale * (i + 1) * (j + 1) for j, q in enumerate(STATS)}
        for i, m in enumerate(LATENCIES)
    }
    if tpot_p90 is not None:
        out["tpot_ms"]["p90"] = tpot_p90
    out["request_throughput"] = 2.0 / scale
    out["output_throughput"] = 200.0 / scale
    return out


def test_relative_error_and_noise() -> None:
    assert relative_error(110.0, 100.0) == pytest.approx(0.10)
    assert relative_error(90.0, 100.0) == pytest.approx(-0.10)
    assert relative_error(1.0, 0.0) is None and relative_error(None, 1.0) is None
    assert noise([100.0]) is None
    assert noise([100.0, 110.0]) == pytest.approx(10 / 105)
    assert noise([100.0, 110.0, 90.0]) == pytest.approx(20 / 100)
    assert noise([100.0, None]) is None


def test_compare_uses_the_mean_of_the_real_runs() -> None:
    real = [summary(1.0), summary(1.2)]
    c = compare(real, summary(1.1))
    e = c["ttft_ms"]["p50"]
    assert e["real"] == pytest.approx(2 * 1.1) and e["sim"] == pytest.approx(2 * 1.1)
    assert e["rel_err"] == pytest.approx(0.0, abs=1e-12)
    assert e["noise"] == pytest.approx(0.2 / 1.1)
    assert e["real_runs"] == [2.0, pytest.approx(2.4)]
    assert c["request_throughput"]["rel_err"] == pytest.approx((2 / 1.1) / ((2 + 2 / 1.2) / 2) - 1)
    assert c["targets"]["met"] and c["targets"]["missed"] == []


def test_targets_name_the_misses() -> None:
    real = [summary(1.0)]
    sim = summary(1.05, tpot_p90=2 * 3 * 1.3)  # tpot p90: real 6, sim 7.8 (+30%)
    c = compare(real, sim)
    assert c["targets"]["missed"] == ["tpot_ms.p90"]
    assert c["targets"]["worst"] == "tpot_ms.p90"
    assert c["targets"]["met"] is False
    assert lookup(c, "tpot_ms.p90")["rel_err"] == pytest.approx(0.3)
    text = format_comparison(c)
    assert "missed on tpot_ms.p90" in text and "+30.0%" in text
    with pytest.raises(ValueError, match="no real run"):
        compare([], sim)


def test_a_missing_real_value_misses_its_target() -> None:
    real = [summary(1.0)]
    real[0]["ttft_ms"]["p50"] = None
    c = compare(real, summary(1.0))
    assert c["ttft_ms"]["p50"]["rel_err"] is None
    assert "ttft_ms.p50" in c["targets"]["missed"]


def stage_frame(tokenize: list[float], wait: list[float], prefill: list[float]) -> pd.DataFrame:
    arrival = np.arange(len(tokenize), dtype=float)
    tokenized = arrival + np.asarray(tokenize)
    scheduled = tokenized + np.asarray(wait)
    return pd.DataFrame({
        "status": ["completed"] * (len(tokenize) - 1) + ["error"],
        "arrival": arrival, "tokenized": tokenized, "first_scheduled": scheduled,
        "first_token": scheduled + np.asarray(prefill),
    })  # fmt: skip


def test_ttft_parts_split_ttft_at_the_stage_times() -> None:
    real = [stage_frame([0.001, 0.003, 9.0], [0.010, 0.030, 9.0], [0.1, 0.1, 9.0])]
    real.append(stage_frame([0.002, 0.004, 9.0], [0.020, 0.040, 9.0], [0.2, 0.2, 9.0]))
    sim = stage_frame([0.002, 0.004, 9.0], [0.010, 0.030, 9.0], [0.1, 0.1, 9.0])
    sim.loc[1, "tokenized"] = np.nan  # a stage time a run lacks leaves that request out
    parts = ttft_parts(real, sim)
    assert list(parts) == list(TTFT_PARTS)
    tok = parts["to_tokenized_ms"]["mean"]  # the failed request (9 s) is left out
    assert tok["real_runs"] == [pytest.approx(2.0), pytest.approx(3.0)]
    assert tok["sim"] == pytest.approx(2.0) and tok["rel_err"] == pytest.approx(2.0 / 2.5 - 1)
    assert parts["to_scheduled_ms"]["p50"]["sim"] == pytest.approx(10.0)
    first = parts["to_first_token_ms"]["p90"]
    assert first["real"] == pytest.approx(150.0) and first["rel_err"] == pytest.approx(-1 / 3)
    c = compare([summary(1.0)], summary(1.0)) | {"ttft_parts": parts}
    assert "to_first_token_ms.p90" in format_comparison(c)
    empty = ttft_parts([sim.assign(tokenized=np.nan)], sim)["to_tokenized_ms"]["p50"]
    assert empty["real"] is None and empty["rel_err"] is None


@settings(max_examples=50, deadline=None)
@given(
    runs=st.lists(st.floats(1.0, 1e4), min_size=1, max_size=4),
    sim=st.floats(1.0, 1e4),
)
def test_rel_err_sign_and_noise_bounds(runs: list[float], sim: float) -> None:
    reals = [summary(r) for r in runs]
    c = compare(reals, summary(sim))
    for key in TARGET_KEYS:
        e = lookup(c, key)
        mean = sum(e["real_runs"]) / len(runs)
        assert e["rel_err"] == pytest.approx(e["sim"] / mean - 1)
        assert (e["rel_err"] > 0) == (e["sim"] > mean) or e["rel_err"] == pytest.approx(0)
        if len(runs) > 1:
            assert 0 <= e["noise"] < 2
