"""``engine profile``'s KV transfer rows: measured on SmolLM2's serving runner on CPU over
real ZeroMQ, the line fitted through them, and the simulator's price read from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.scheduler.config import SchedulerConfig
from engine.kvcache.transfer_wire import gather, page_bytes
from engine.runner.args import RunnerArgs
from engine.runner.model_runner import ModelRunner
from lab.profile.transfer import measure_transfer, transfer_rows
from sim.costs.profile import COLUMNS, ProfileRow, read_profile, write_profile
from sim.costs.transfer import transfer_costs

PAGE = 16
PROVENANCE = {"hardware": "test", "model": "test", "date": "today", "command": "test"}


def runner_of(model: str, num_pages: int) -> ModelRunner:
    scheduler = SchedulerConfig(num_pages=num_pages, page_size=PAGE)
    return ModelRunner(RunnerArgs(model=model, cpu_threads=1, scheduler=scheduler))


def values(rows: list[ProfileRow]) -> dict[str, float]:
    return {r.kind: r.duration_s for r in rows}


@pytest.mark.slow
def test_measure_transfer_moves_the_runner_pool_and_writes_sane_rows(model_ready: str) -> None:
    runner = runner_of(model_ready, num_pages=40)
    pool = runner.kv
    gen = torch.Generator().manual_seed(0)
    for layer in [*pool.k, *pool.v]:
        layer.copy_(torch.randn(layer.shape, generator=gen))
    source, destination = list(range(16)), list(range(24, 40))  # the last transfer's pages
    assert not torch.equal(gather(pool, source), gather(pool, destination))
    info: dict[str, str] = {}
    rows = measure_transfer(runner, 3, info)

    assert torch.equal(gather(pool, source), gather(pool, destination))  # scattered there
    assert [r.kind for r in rows] == ["kv_transfer", "kv_transfer_token"]
    assert all(r.tp == 1 and r.repeats == 3 and r.split == "fit" for r in rows)
    fixed, per_token = values(rows).values()
    token_bytes = page_bytes(pool) / PAGE  # SmolLM2 in float32: 46080 bytes a KV token
    assert 0 <= fixed < 0.5 and 0 < per_token < token_bytes / 10e6  # faster than 10 MB/s
    timed = info["transfer"]  # medians of 1, 4 and 16 pages: 64 twice overflow 40
    assert "tcp://127.0.0.1" in timed and "pages 1:" in timed and ",16:" in timed
    assert ",64:" not in timed

    one_page: dict[str, str] = {}
    assert measure_transfer(runner_of(model_ready, num_pages=1), 1, one_page) == []
    assert one_page["transfer"].startswith("not measured")


def test_transfer_rows_are_the_least_squares_line() -> None:
    counts = [1, 4, 16, 64, 256]
    rows = transfer_rows(counts, [0.002 + 0.0008 * n for n in counts], PAGE, 5)
    assert values(rows) == pytest.approx({"kv_transfer": 0.002, "kv_transfer_token": 5e-5})
    noise = [1e-4, -1e-4, 0, 1e-4, -1e-4]
    noisy = [0.002 + 0.0008 * n + e for n, e in zip(counts, noise, strict=True)]
    fitted = values(transfer_rows(counts, noisy, PAGE, 5))
    assert fitted["kv_transfer"] == pytest.approx(0.002, abs=2e-4)
    assert fitted["kv_transfer_token"] == pytest.approx(5e-5, rel=1e-3)
    # a negative intercept is no time; a single point goes through the origin
    assert values(transfer_rows(counts, [0.001 * n - 0.003 for n in counts], PAGE, 5)) == (
        pytest.approx({"kv_transfer": 0.0, "kv_transfer_token": 0.001 / PAGE})
    )
    assert values(transfer_rows([4], [0.008], PAGE, 5)) == pytest.approx(
        {"kv_transfer": 0.0, "kv_transfer_token": 0.002 / PAGE}
    )


def test_the_simulator_prices_a_transfer_from_the_rows(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    rows = transfer_rows([1, 4], [0.003, 0.009], PAGE, 5)  # 1 ms + 2 ms a page
    write_profile(path, PROVENANCE, rows)
    assert path.read_text().splitlines()[4] == ",".join(COLUMNS)
    profile = read_profile(path)
    token_bytes = 46080.0

    costs = transfer_costs(profile, token_bytes)
    assert costs.source == profile.path
    assert (costs.fixed, costs.per_token) == pytest.approx((0.001, 0.002 / PAGE))
    assert costs.transfer_time(32) == pytest.approx(0.001 + 0.004) and costs.transfer_time(0) == 0

    latency = transfer_costs(profile, token_bytes, latency_s=5e-4)
    assert (latency.fixed, latency.per_token) == pytest.approx((5e-4, 0.002 / PAGE))
    assert "transfer_latency_s 0.0005" in latency.source
    link = transfer_costs(profile, token_bytes, gbps=10.0)
    assert (link.fixed, link.per_token) == pytest.approx((0.001, token_bytes / 10e9))
    given = transfer_costs(None, token_bytes, latency_s=2e-5, gbps=50.0)
    assert (given.fixed, given.per_token) == pytest.approx((2e-5, token_bytes / 50e9))

    without = tmp_path / "none.csv"
    write_profile(without, PROVENANCE, [])
    with pytest.raises(ValueError, match=r"has no .*kv_transfer.* rows.*transfer_gbps"):
        transfer_costs(read_profile(without), token_bytes, latency_s=1e-3)
    with pytest.raises(ValueError, match=r"no profile.*transfer_latency_s"):
        transfer_costs(None, token_bytes, gbps=10.0)
