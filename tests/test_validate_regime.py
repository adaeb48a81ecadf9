"""The load regime of a validation run, on synthetic request tables whose answer is known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lab.validate.compare import compare, format_comparison
from lab.validate.regime import classify, regimes


def table(arrival: np.ndarray, scheduled: np.ndarray, finished: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "status": "completed",
            "arrival": arrival,
            "tokenized": arrival + 0.01,
            "first_scheduled": scheduled,
            "first_token": scheduled + 0.1,
            "finished": finished,
        }
    )


ARRIVAL = np.arange(200.0)  # one request a second for 200 s


def fifo(service_s: float) -> pd.DataFrame:
    """One server taking requests first come first served, ``service_s`` each."""
    finished = np.empty_like(ARRIVAL)
    free = 0.0
    for i, a in enumerate(ARRIVAL):
        free = finished[i] = max(a + 0.05, free) + service_s
    return table(ARRIVAL, finished - service_s, finished)


def test_stable_backlogged_overloaded() -> None:
    stable = classify(table(ARRIVAL, ARRIVAL + 0.06, ARRIVAL + 2.0))
    assert stable["regime"] == "stable" and abs(stable["growth"]) < 0.01
    assert stable["mean_waiting"] == pytest.approx(0.05, rel=0.05)
    assert stable["arrival_rate"] == pytest.approx(1.0)
    # every request waits 3 s for admission, the queue does not grow: 3 wait on average
    backlogged = classify(table(ARRIVAL, ARRIVAL + 3.01, ARRIVAL + 4.0))
    assert backlogged["regime"] == "backlogged" and abs(backlogged["growth"]) < 0.01
    assert backlogged["mean_waiting"] == pytest.approx(3.0, rel=0.05)
    # served at half the offered rate: the system gains half of each second's arrival
    overloaded = classify(fifo(2.0))
    assert overloaded["regime"] == "overloaded"
    assert overloaded["growth"] == pytest.approx(0.5, abs=0.02)
    assert classify(fifo(0.5))["regime"] == "stable"  # 50 % busy, nobody waits
    assert classify(fifo(1.04))["regime"] == "backlogged"  # 104 %: grows by 0.04, queues


def test_queue_growth_without_waiting_is_overload() -> None:
    """An engine that admits every request at once but finishes them at 80 % of the offered
    rate (its batch grows) is overloaded though its waiting queue is empty."""
    finished = ARRIVAL / 0.8 + 1.0
    run = classify(table(ARRIVAL, ARRIVAL + 0.02, finished))
    assert run["regime"] == "overloaded" and run["mean_waiting"] < 0.1
    assert run["growth"] == pytest.approx(0.2, abs=0.02)


def test_a_short_run_overloads_only_when_its_queue_gains_requests() -> None:
    """16 requests 10 s apart, each admitted at once, the later ones longer (2 s growing to
    20 s): the system holds one more request at the end than at the start, which tilts the
    fitted slope past 0.10 of the arrival rate, but the engine never fell behind by three
    requests, so the run is not overloaded. 16 requests a second apart, served at half that
    rate, gain six: overloaded."""
    arrival = np.arange(16) * 10.0
    longer = classify(table(arrival, arrival + 0.05, arrival + np.linspace(2.0, 20.0, 16)))
    assert longer["growth"] >= 0.10 and longer["gain"] < 3.0
    assert longer["regime"] == "stable"
    arrival = np.arange(16.0)
    slow = classify(table(arrival, arrival + 0.02, 1.0 + np.arange(16) * 2.0))
    assert slow["regime"] == "overloaded"
    assert slow["gain"] == pytest.approx(6.0, abs=1.5)


def test_runs_without_stage_times_use_the_first_token() -> None:
    run = table(ARRIVAL, ARRIVAL + 3.0, ARRIVAL + 4.0)
    run["tokenized"] = run["first_scheduled"] = np.nan  # another server: client times only
    assert classify(run)["mean_waiting"] == pytest.approx(3.1, rel=0.05)


def test_comparison_keeps_every_run_s_regime() -> None:
    real = [fifo(2.0), table(ARRIVAL, ARRIVAL + 0.06, ARRIVAL + 2.0)]
    out = regimes(real, fifo(0.5))
    assert [r["regime"] for r in out["real_runs"]] == ["overloaded", "stable"]
    assert out["real"] == "overloaded" and out["sim"]["regime"] == "stable"
    assert out["thresholds"] == {"overload_growth": 0.1, "overload_gain": 3.0,
                                 "backlog_waiting": 1.0}  # fmt: skip
    one = regimes([table(ARRIVAL[:1], ARRIVAL[:1] + 1, ARRIVAL[:1] + 2)], fifo(0.5))
    assert one["real"] is None and one["real_runs"][0]["regime"] is None
    summary = {m: dict.fromkeys(("mean", "p50", "p90", "p99"), 1.0)
               for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")}  # fmt: skip
    summary |= {"request_throughput": 1.0, "output_throughput": 1.0}
    comparison = compare([summary], summary) | {"regime": out}
    text = format_comparison(comparison)
    assert "regime: real run: overloaded [overloaded (growth +0.500, gain +7" in text
