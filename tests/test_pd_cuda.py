"""Prefill/decode disaggregation on one GPU: a prefill and a decode server sharing it hand the
KV over through CUDA IPC (``--pd-cuda-ipc``) or through host memory (the default), and their
greedy output is a colocated server's, token for token.

The Qwen3-0.6B shape with dummy weights and the tokenizer `scripts/gpu_prepare.py` puts in
`.gpu/tokenizer`; skipped without CUDA or that tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from conftest import Server, start_server, stop_server
from test_engine_router import running_router

TOKENIZER = Path(__file__).resolve().parents[1] / ".gpu" / "tokenizer"
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not TOKENIZER.is_dir(), reason=f"needs {TOKENIZER}"),
]
MODEL = "qwen3-0.6b"
COMMON = ("--device", "cuda", "--dummy-weights", "--tokenizer", str(TOKENIZER),
          "--num-pages", "512", "--pd-timeout", "30")  # fmt: skip
PROMPTS = ["The capital of France is", "Here is a list of the planets, from the sun out: " * 12]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Server]]:
    flags = {
        "colocated": COMMON,
        "prefill": (*COMMON, "--role", "prefill"),
        "decode": (*COMMON, "--role", "decode", "--pd-cuda-ipc"),
        "decode_host": (*COMMON, "--role", "decode", "--no-pd-cuda-ipc"),
    }
    with ThreadPoolExecutor(len(flags)) as pool:
        futures = {k: pool.submit(start_server, *v, model=MODEL) for k, v in flags.items()}
        started = {k: f.result() for k, f in futures.items() if f.exception() is None}
    try:
        assert len(started) == len(flags), "a server did not start"
        yield started
    finally:
        for server in started.values():
            stop_server(server)


def generate(url: str, text: str) -> list[int]:
    body = {"text": text, "sampling_params": {"max_new_tokens": 12, "temperature": 0,
            "ignore_eos": True}}  # fmt: skip
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return list(r.json()["output_ids"])


@pytest.mark.parametrize("decode", ["decode", "decode_host"])
def test_the_pair_on_one_gpu_answers_as_a_colocated_server(
    servers: dict[str, Server], decode: str
) -> None:
    prefill, dec = servers["prefill"], servers[decode]
    before = prefill.metrics()
    ipc_before = dec.metrics().get("engine_kv_transfers_cuda_ipc_total", 0.0)
    sent_before = before.get("engine_kv_transfers_total", 0.0)
    with running_router("--prefill", prefill.url, "--decode", dec.url) as (_, router):
        for text in PROMPTS:
            assert generate(router, text) == generate(servers["colocated"].url, text), text
    sent = prefill.metrics().get("engine_kv_transfers_total", 0.0) - sent_before
    assert sent == len(PROMPTS)  # every one ok (the only status series)
    ipc = dec.metrics().get("engine_kv_transfers_cuda_ipc_total", 0.0) - ipc_before
    assert ipc == (len(PROMPTS) if decode == "decode" else 0)
    for server in (prefill, dec):
        assert server.metrics().get("engine_kv_pages_in_transfer", 0.0) == 0
    after = prefill.metrics()  # the transfers' time from send to acknowledgment (-s shows it)
    delta = {k: after[k] - before.get(k, 0.0) for k in after if k.startswith("engine_kv_transfer_")}
    print(decode, {k: f"{v:.4g}" for k, v in delta.items()})
