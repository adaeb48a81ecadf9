"""A small abort storm: half the streaming clients leave at random points, under KV pressure.

The full storm is ``benchmarks/abort_storm.py`` (figures in ``reports/robustness/``);
this one runs the same driver with fewer requests on a KV pool too small for
the batch, so aborts meet preemptions, in each process layout (``--layout``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest
from conftest import running_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from abort_storm import PROMPTS, reference, storm
from serving_load import scrape, wait_idle

pytestmark = pytest.mark.slow

MAX_TOKENS = 12


@pytest.mark.parametrize("layout", ["split", "frontend", "inline"])
def test_abort_storm_leaves_no_pages_and_whole_streams(model_ready: str, layout: str) -> None:
    # 12 pages of 8 tokens: each request (~4 prompt + 12 output tokens) grows into a second
    # page, which the 12 that fit at first cannot all have: preemption
    args = ("--num-pages", "12", "--page-size", "8", "--max-running", "12", "--layout", layout)
    with running_server(*args, cpu_threads=2) as server:
        expected = asyncio.run(reference(server.url, PROMPTS[:4], MAX_TOKENS))
        before = scrape(server.url)
        result = asyncio.run(storm(server.url, expected, 48, 12, MAX_TOKENS, seed=1))
        after = wait_idle(server.url)
        assert result.failed == 0 and result.wrong == 0, result
        assert result.completed >= 15 and result.aborted >= 15, result
        assert after["engine_kv_pages_held"] == 0
        assert after["engine_num_requests_running"] == 0
        assert after["engine_num_requests_waiting"] == 0
        assert after["engine_num_requests_open"] == 0
        aborted = after["engine_requests_aborted_total"] - before["engine_requests_aborted_total"]
        assert aborted >= 10
        assert after["engine_num_preemptions_total"] > 0, "the pool was meant to run out"
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        assert "Traceback" not in server.log()
