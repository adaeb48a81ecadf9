"""The engine's host KV tier: the pool's copies (on CPU, and on CUDA where there is one), and
a CPU server that hits its host tier.

A server with a device pool too small for three prompts evicts the first
prompt's prefix to the host while it serves the other two; the first prompt
again is then served from the host (the metrics count host hit tokens) and
gives the same greedy tokens as its cold run.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest
import torch
from conftest import Server, running_server

from engine.kvcache.host_pool import HostKVPool
from engine.kvcache.pool import KVPool

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


@pytest.mark.parametrize("device", DEVICES)
def test_pool_writes_then_loads_pages_back(device: str) -> None:
    pool = KVPool(2, 6, 4, 2, 8, torch.float32, torch.device(device))
    for layer in range(2):
        pool.k[layer].copy_(torch.randn_like(pool.k[layer]))
        pool.v[layer].copy_(torch.randn_like(pool.v[layer]))
    host = HostKVPool(pool, 5)
    before = [t.clone() for t in (*pool.k, *pool.v)]
    host.run(writes=[(1, 3), (4, 4), (2, 0)], loads=[])
    host.run(writes=[], loads=[(3, 5), (4, 0), (0, 3)])  # page 1 -> 5, page 4 -> 0, page 2 -> 3
    if device == "cuda":
        torch.cuda.synchronize()
    for was, now in zip(before, (*pool.k, *pool.v), strict=True):
        assert torch.equal(now[5], was[1]) and torch.equal(now[0], was[4])
        assert torch.equal(now[3], was[2]) and torch.equal(now[1], was[1])
    assert (host.written_tokens, host.loaded_tokens) == (12, 12)
    assert host.load_seconds() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_plan_writes_before_it_loads(device: str) -> None:
    """A page written out and reused in one plan: the load into it follows the write."""
    pool = KVPool(1, 3, 2, 1, 4, torch.float32, torch.device(device))
    pool.k[0].copy_(torch.arange(pool.k[0].numel(), dtype=torch.float32).view_as(pool.k[0]))
    host = HostKVPool(pool, 2)
    old_page_1 = pool.k[0][1].clone()
    host.run(writes=[(0, 1)], loads=[])
    host.run(writes=[(1, 0)], loads=[(1, 1)])  # page 1 out to slot 0, then slot 1 into page 1
    host.run(writes=[], loads=[(0, 2)])
    assert torch.equal(pool.k[0][2], old_page_1)


PAGE = 16
PROMPTS = {  # 96 tokens each: 6 full pages, 5 of them cached (the last token is recomputed)
    name: [base + (7 * i) % 50 for i in range(96)]
    for name, base in (("a", 1000), ("b", 3000), ("c", 5000))
}


def generate(server: Server, ids: list[int]) -> list[int]:
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
    }
    resp = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["output_ids"])


def metric(server: Server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert found is not None, f"no {name} in /metrics"
    return float(found.group(1))


def settled_metric(server: Server, name: str) -> float:
    """``name`` once the scheduler's stats update reached the frontend (they come after the
    tokens)."""
    deadline = time.monotonic() + 10
    value = metric(server, name)
    while value == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        value = metric(server, name)
    return value


@pytest.mark.parametrize(
    ("policy", "tp"),
    [
        ("write_back", "1"),
        ("write_through", "1"),
        pytest.param("write_back", "2", marks=pytest.mark.slow),  # every rank copies its shard
    ],
)
def test_an_evicted_prefix_is_served_from_the_host(model_ready: str, policy: str, tp: str) -> None:
    args = ("--num-pages", "14", "--page-size", str(PAGE), "--host-kv-gb", "0.05",
            "--host-kv-policy", policy, "--tp", tp)  # fmt: skip
    with running_server(*args) as server:
        cold = generate(server, PROMPTS["a"])
        generate(server, PROMPTS["b"])
        generate(server, PROMPTS["c"])  # b and c took the device pages a's prefix held
        assert metric(server, "engine_external_prefix_cache_hits_total") == 0
        warm = generate(server, PROMPTS["a"])
        hits = settled_metric(server, "engine_external_prefix_cache_hits_total")
        assert warm == cold
        assert hits == 5 * PAGE
        assert metric(server, "engine_kv_host_loaded_tokens_total") == hits
        assert metric(server, "engine_kv_host_written_tokens_total") >= hits
        assert metric(server, "engine_kv_host_load_seconds_total") > 0
        assert metric(server, "engine_kv_host_pages_total") > 0
