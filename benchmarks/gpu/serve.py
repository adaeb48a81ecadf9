"""The offline workload through `engine serve` over HTTP, against its roofline and HF `generate`.

Run on the GPU machine (after ``source scripts/gpu_env.sh``)::

    python3 benchmarks/gpu/serve.py --model llama-3.1-8b --out $OUT/serve_llama.json

The workload: 256 requests sent at once as non-streaming ``/v1/completions`` with
token-id prompts; with ``random.seed(0)`` each request draws its input length
then its output length, both uniform in [100, 1024] (140,797 output tokens);
``ignore_eos``, temperature 0.6. The server runs the model preset with dummy
bf16 weights and SmolLM2's tokenizer (``.gpu/tokenizer``).

The workload roofline: prefill at the measured bf16 matmul rate (2 FLOPs per
matmul parameter per prompt token, attention 4 * heads * head_dim per causal
query-key pair), and each decode step reading every weight but the embedding
table plus the live KV at the measured copy bandwidth, all requests starting
together. With ``--tp N`` the server runs N tensor-parallel GPUs and the
roofline is that of N GPUs, each doing 1/N of the work (the all-reduces cost
nothing in it). The same run times HF transformers ``generate`` (the same dummy
weights, bf16, batches of ``--hf-batch`` prompts of the workload, left padded)
after the server has stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ceilings import ceilings_now, run_header

from schema.models import ModelConfig, get_preset

NUM, LOW, HIGH = 256, 100, 1024


def workload() -> list[tuple[list[int], int]]:
    random.seed(0)
    lengths = [(random.randint(LOW, HIGH), random.randint(LOW, HIGH)) for _ in range(NUM)]
    ids = random.Random(1)
    return [([ids.randint(0, 10000) for _ in range(n)], out) for n, out in lengths]


def roofline(
    config: ModelConfig, reqs: list[tuple[list[int], int]], bw: float, peak: float, gpus: int
) -> dict[str, float]:
    """Seconds at the ceilings of ``gpus`` GPUs, each doing 1/gpus of the work (all-reduce free)."""
    c = config
    h, d = c.hidden_size, c.head_dim
    linear = c.num_layers * (
        h * d * (2 * c.num_heads + 2 * c.num_kv_heads) + 3 * h * c.intermediate_size
    )
    head = h * c.vocab_size
    weights = 2 * (linear + head + (2 * c.num_layers + 1) * h)
    kv = c.kv_bytes_per_token(2)
    prefill = (
        sum(
            2 * linear * len(p)
            + 4 * c.num_layers * c.num_heads * d * len(p) * (len(p) + 1) // 2
            + 2 * head
            for p, _ in reqs
        )
        / peak
        / gpus
    )
    decode = 0.0
    for step in range(max(out for _, out in reqs)):
        live = sum(len(p) + step for p, out in reqs if out > step)
        decode += (weights + live * kv) / bw / gpus
    tokens = sum(out for _, out in reqs)
    return {"prefill_s": prefill, "decode_s": decode, "tokens_per_s": tokens / (prefill + decode)}


async def send_all(url: str, model: str, reqs: list[tuple[list[int], int]]) -> tuple[float, int]:
    limits = httpx.Limits(max_connections=len(reqs), max_keepalive_connections=len(reqs))
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:

        async def one(prompt: list[int], out: int) -> int:
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": out,
                "temperature": 0.6,
                "ignore_eos": True,
            }
            r = await client.post(url + "/v1/completions", json=body)
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(p, o) for p, o in reqs))
        return time.perf_counter() - t0, sum(counts)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group; SIGKILL it if it is still there after 60 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    cmd = [
        sys.executable,
        "-m",
        "lab.cli.engine",
        "serve",
        "--model",
        args.model,
        "--dummy-weights",
        "--tokenizer",
        args.tokenizer,
        "--device",
        "cuda",
        "--port",
        str(args.port),
        "--max-running",
        "256",
        "--tp",
        str(args.tp),
        *args.serve_args,
    ]
    proc = subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{args.port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("server not ready in 600 s")


def hf_generate(
    model: str, reqs: list[tuple[list[int], int]], batch: int, new: int
) -> dict[str, Any]:
    """HF ``generate`` on the same dummy weights: ``batch`` prompts, ``new`` tokens each."""
    from core.scheduler import SchedulerConfig
    from engine.runner import ModelRunner, RunnerArgs

    runner = ModelRunner(
        RunnerArgs(
            model=model,
            dummy_weights=True,
            device="cuda",
            scheduler=SchedulerConfig(num_pages=64),
            cuda_graph=False,
            attention_backend="torch",
        )
    )
    state = {t.name: t.target for t in runner.model.checkpoint_tensors()}
    hf = hf_model(runner.config)
    hf.load_state_dict(state, strict=False)
    del runner, state
    torch.cuda.empty_cache()
    prompts = [p for p, _ in reqs[:batch]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device="cuda")
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device="cuda")
    with torch.no_grad():
        hf.generate(ids[:, :8], attention_mask=mask[:, :8], max_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hf.generate(
            ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False
        )
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"batch": batch, "new_tokens": new, "wall_s": wall, "tokens_per_s": batch * new / wall}


def hf_model(c: ModelConfig) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**c.to_hf() | {"eos_token_id": None, "pad_token_id": 0})
    with torch.device("cuda"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--tokenizer", default=".gpu/tokenizer")
    ap.add_argument("--port", type=int, default=18100)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs of the server")
    ap.add_argument("--hf-batch", type=int, default=32)
    ap.add_argument("--hf-new-tokens", type=int, default=256)
    ap.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[])
    args = ap.parse_args()
    ceilings = ceilings_now()
    bw = ceilings["copy"]["read_plus_write_bytes_per_s"]
    peak = ceilings["matmul_bf16"]["flops_per_s"]
    reqs = workload()
    config = get_preset(args.model)
    result = run_header(
        model=args.model,
        tp=args.tp,
        ceilings=ceilings,
        workload={
            "requests": NUM,
            "input_tokens": sum(len(p) for p, _ in reqs),
            "output_tokens": sum(o for _, o in reqs),
        },
        roofline=roofline(config, reqs, bw, peak, args.tp),
    )
    log = args.out.with_suffix(".server.log")
    t0 = time.perf_counter()
    proc, url = start_server(args, log)
    result["server_ready_s"] = time.perf_counter() - t0
    try:
        asyncio.run(send_all(url, args.model, workload()[:8]))  # warm-up
        wall, tokens = asyncio.run(send_all(url, args.model, reqs))
        metrics = httpx.get(url + "/metrics", timeout=10).text
    finally:
        stop_server(proc)
    tok_s = tokens / wall
    result["engine"] = {
        "wall_s": wall,
        "output_tokens": tokens,
        "tokens_per_s": tok_s,
        "workload_roofline_fraction": tok_s / result["roofline"]["tokens_per_s"],
        "metrics": [
            ln for ln in metrics.splitlines() if ln.startswith("engine_") and "bucket" not in ln
        ],
    }
    print(json.dumps(result["engine"] | {"roofline": result["roofline"]}), flush=True)
    if args.hf_batch:
        hf = hf_generate(args.model, reqs, args.hf_batch, args.hf_new_tokens)
        hf["engine_speedup"] = tok_s / hf["tokens_per_s"]
        result["hf_generate"] = hf
        print(json.dumps(hf), flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
