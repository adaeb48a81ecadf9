"""Serve a model on a GPU with `engine serve`, load it over HTTP, shut it down (not a test).

The GPU machine cannot fetch weights, so the model folders hold a config and the
SmolLM2 tokenizer only and the server runs with ``--dummy-weights``:

    python scripts/gpu_serve_smoke.py --tokenizer-dir ~/.cache/servelab/models/smollm2-135m \
        --workdir /tmp/smoke --out reports/gpu_serve_smoke.json

``--shape smollm2`` keeps SmolLM2's config; ``--shape llama-3.1-8b`` writes Llama-3.1-8B's
shape (32 layers, 4096 hidden, 32/8 heads, llama3 rope) with SmolLM2's 49,152-token vocabulary,
so that sampled ids stay inside the tokenizer. Each load sends N concurrent streaming
completions (greedy, EOS ignored) and reports output chunks per second and TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

LLAMA_31_8B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_theta": 500000.0,
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
LOADS = {  # (concurrency, max_tokens, prompt words)
    "smollm2": [(1, 32, 16), (16, 64, 64), (64, 64, 256)],
    "llama-3.1-8b": [(1, 64, 16), (16, 64, 256), (64, 128, 512), (128, 128, 512)],
}


def model_dir(tokenizer_dir: Path, shape: str, workdir: Path) -> Path:
    out = workdir / shape
    out.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.suffix in (".json", ".jinja"):
            shutil.copy(f, out / f.name)
    if shape == "llama-3.1-8b":
        config = json.loads((out / "config.json").read_text())
        config.update(LLAMA_31_8B)
        (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


async def one(client: httpx.AsyncClient, url: str, body: dict) -> tuple[float | None, int]:
    t0 = time.perf_counter()
    ttft, chunks = None, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread()).decode()}")
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                chunks += 1
    return ttft, chunks


async def load(url: str, model: str, conc: int, max_tokens: int, words: int) -> dict:
    prompt = " ".join(["word"] * words)
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        bodies = [
            {
                "model": model,
                "prompt": f"{prompt} {i}",
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
            for i in range(conc)
        ]
        res = await asyncio.gather(*[one(client, url, b) for b in bodies])
        wall = time.perf_counter() - t0
    ttfts = sorted(r[0] for r in res if r[0] is not None)
    chunks = sum(r[1] for r in res)
    return {
        "concurrency": conc,
        "max_tokens": max_tokens,
        "prompt_words": words,
        "wall_s": round(wall, 3),
        "output_chunks": chunks,
        "chunks_per_s": round(chunks / wall, 1),
        "ttft_p50_ms": round(1000 * ttfts[len(ttfts) // 2], 1),
        "ttft_max_ms": round(1000 * ttfts[-1], 1),
    }


def exercise(url: str, proc: subprocess.Popen, loads: list[tuple[int, int, int]]) -> dict:
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    chat = httpx.post(
        url + "/v1/chat/completions",
        timeout=120,
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    )
    bad = httpx.post(
        url + "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": -3}
    )
    asyncio.run(load(url, model, 4, 8, 16))  # warm-up
    r: dict = {
        "chat_status": chat.status_code,
        "chat_usage": chat.json().get("usage"),
        "bad_input_status": bad.status_code,
    }
    r["loads"] = [asyncio.run(load(url, model, *spec)) for spec in loads]
    r["metrics_after"] = {
        line.split()[0]: line.split()[1]
        for line in httpx.get(url + "/metrics").text.splitlines()
        if line.startswith(("engine_kv_pages", "engine_num_", "engine_prefix"))
    }
    proc.send_signal(signal.SIGTERM)
    r["exit_code"] = proc.wait(60)
    time.sleep(2)
    ps = subprocess.run(["ps", "-eo", "pgid,cmd"], capture_output=True, text=True).stdout
    r["left_processes"] = [ln for ln in ps.splitlines() if ln.split()[0] == str(proc.pid)]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokenizer-dir", type=Path, required=True)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/gpu-smoke"))
    ap.add_argument("--shape", action="append", choices=sorted(LOADS))
    ap.add_argument("--port", type=int, default=18000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    results = {}
    for i, shape in enumerate(args.shape or sorted(LOADS, reverse=True)):
        folder = model_dir(args.tokenizer_dir, shape, args.workdir)
        url = f"http://127.0.0.1:{args.port + i}"
        cmd = [
            sys.executable,
            "-m",
            "engine.cli",
            "serve",
            "--model",
            str(folder),
            "--dummy-weights",
            "--device",
            "cuda",
            "--port",
            str(args.port + i),
        ]
        log = open(args.workdir / f"{shape}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        try:
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"{shape}: server exited, see {log.name}")
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(1)
            results[shape] = {
                "ready_s": round(time.time() - t0, 1),
                **exercise(url, proc, LOADS[shape]),
            }
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        print(json.dumps({shape: results[shape]}, indent=1), flush=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
