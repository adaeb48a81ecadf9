"""Interactive latency: one stream at a time over HTTP, against one prefill and one decode step.

Run on the GPU machine (after ``source scripts/gpu_env.sh``)::

    python3 benchmarks/gpu/interactive.py --model llama-3.1-8b --out $OUT/interactive.json

For each variant (``base``; ``fused``: ``SERVELAB_FUSED_ROPE_STORE=1`` in the
server's environment) it starts ``engine serve --device cuda --dummy-weights``
and sends, one after the other, ``--repeats`` streamed ``/v1/completions`` of
``--prompts`` token-id prompts (fresh random ids each time, so no prefix-cache
hit), each generating ``--new`` tokens (``ignore_eos``, greedy). TTFT is the time
from sending to the first streamed chunk; TPOT is (last chunk - first chunk) /
(new tokens - 1); ``--logprobs N`` asks for each token's log-prob and its N most likely
alternatives (the server computes them beside the step). Medians are set against ceilings
measured in the same run:

- TTFT against one prefill of the prompt: model FLOPs at the bf16 matmul rate, or
  the weights read once at the copy bandwidth, whichever is longer;
- TPOT against one batch-1 decode step at the mean context of the generation:
  every weight but the embedding table, plus the context's KV, at the copy bandwidth.

With ``--runner-steps`` the same run then builds the model runner alone (no
server) and times batch-1 decode steps at the same contexts the way
``runner.py`` does (pipelined wall clock, and device time per step from
CUDA events), so the HTTP TPOT and the runner's step sit side by side.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import runner
from ceilings import ceilings_now, run_header
from serve import start_server, stop_server

from schema.models import ModelConfig, get_preset

VARIANTS = {"base": "0", "fused": "1"}  # SERVELAB_FUSED_ROPE_STORE of the server


def weight_bytes(c: ModelConfig) -> int:
    """Bytes a decode step reads of the weights (the LM head once, not the embedding table)."""
    h, d = c.hidden_size, c.head_dim
    linear = c.num_layers * (
        h * d * (2 * c.num_heads + 2 * c.num_kv_heads) + 3 * h * c.intermediate_size
    )
    return 2 * (linear + h * c.vocab_size + (2 * c.num_layers + 1) * h)


def prefill_s(c: ModelConfig, tokens: int, bw: float, peak: float) -> float:
    h, d = c.hidden_size, c.head_dim
    linear = c.num_layers * (
        h * d * (2 * c.num_heads + 2 * c.num_kv_heads) + 3 * h * c.intermediate_size
    )
    attention = 4 * c.num_layers * c.num_heads * d * tokens * (tokens + 1) // 2
    flops = 2 * linear * tokens + attention + 2 * h * c.vocab_size
    return max(flops / peak, weight_bytes(c) / bw)


def decode_step_s(c: ModelConfig, context: int, bw: float) -> float:
    return (weight_bytes(c) + context * c.kv_bytes_per_token(2)) / bw


def stream_one(
    client: httpx.Client, url: str, model: str, prompt: list[int], new: int, logprobs: int | None
) -> dict:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": new,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    if logprobs is not None:
        body["logprobs"] = logprobs
    chunks: list[float] = []
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                chunks.append(time.perf_counter())
    if not chunks:
        raise RuntimeError("the stream carried no chunk")
    return {
        "ttft_s": chunks[0] - t0,
        "tpot_s": (chunks[-1] - chunks[0]) / (new - 1),
        "e2e_s": chunks[-1] - t0,
        "chunks": len(chunks),
    }


def serve_variant(args: argparse.Namespace, variant: str, bw: float, peak: float) -> dict:
    os.environ["SERVELAB_FUSED_ROPE_STORE"] = VARIANTS[variant]
    config = get_preset(args.model)
    log = args.out.with_name(f"{args.out.stem}_{variant}.server.log")
    t0 = time.perf_counter()
    proc, url = start_server(args, log)
    out: dict[str, Any] = {"variant": variant, "server_ready_s": time.perf_counter() - t0}
    rng = random.Random(5)
    rows = []
    try:
        with httpx.Client(timeout=httpx.Timeout(600.0)) as client:
            warm = [rng.randint(1, 10000) for _ in range(64)]
            stream_one(client, url, args.model, warm, 16, args.logprobs)
            for length in (int(p) for p in args.prompts.split(",")):
                runs = []
                for _ in range(args.repeats):
                    prompt = [rng.randint(1, 10000) for _ in range(length)]
                    run = stream_one(client, url, args.model, prompt, args.new, args.logprobs)
                    runs.append(run)
                ttft = statistics.median(r["ttft_s"] for r in runs)
                tpot = statistics.median(r["tpot_s"] for r in runs)
                ttft_floor = prefill_s(config, length, bw, peak)
                tpot_floor = decode_step_s(config, length + args.new // 2, bw)
                row = {
                    "prompt_tokens": length,
                    "new_tokens": args.new,
                    "ttft_s": ttft,
                    "tpot_s": tpot,
                    "prefill_roofline_s": ttft_floor,
                    "decode_step_roofline_s": tpot_floor,
                    "ttft_roofline_fraction": ttft_floor / ttft,
                    "tpot_roofline_fraction": tpot_floor / tpot,
                    "runs": runs,
                }
                print(json.dumps({"variant": variant, **{k: row[k] for k in list(row)[:8]}}))
                rows.append(row)
    finally:
        stop_server(proc)
    out["streams"] = rows
    return out


def runner_steps(args: argparse.Namespace, variant: str) -> list[dict[str, Any]]:
    """Batch-1 decode steps of the runner alone, at the streams' mean contexts."""
    from core.scheduler import SchedulerConfig
    from engine.runner import RunnerArgs
    from engine.runner.tp import TPLeader

    os.environ["SERVELAB_FUSED_ROPE_STORE"] = VARIANTS[variant]
    leader = TPLeader(
        RunnerArgs(
            model=args.model,
            dummy_weights=True,
            device="cuda",
            scheduler=SchedulerConfig(num_pages=4096, max_running=16),
        )
    )
    rows = []
    for length in (int(p) for p in args.prompts.split(",")):
        row = runner.time_decode(leader, 1, length + args.new // 2)
        print(json.dumps({"variant": variant, "runner": row}), flush=True)
        rows.append(row)
    leader.shutdown()
    del leader
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--tokenizer", default=".gpu/tokenizer")
    ap.add_argument("--port", type=int, default=18500)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", default="1024,8192", help="prompt lengths in tokens")
    ap.add_argument("--new", type=int, default=256, help="tokens generated per stream")
    ap.add_argument("--repeats", type=int, default=5, help="streams per prompt length")
    ap.add_argument(
        "--logprobs", type=int, default=None, help="each request asks for N top log-probs"
    )
    ap.add_argument("--variants", default="fused", help="comma list of: base, fused (the default)")
    ap.add_argument("--runner-steps", action="store_true")
    ap.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[])
    args = ap.parse_args()
    ceilings = ceilings_now()
    bw = ceilings["copy"]["read_plus_write_bytes_per_s"]
    peak = ceilings["matmul_bf16"]["flops_per_s"]
    torch.cuda.empty_cache()  # the server sizes its KV pool from the memory left free
    runner.CEILINGS.update(copy_bytes_per_s=bw, matmul_flops_per_s=peak)
    result = run_header(model=args.model, ceilings=ceilings, variants=[])
    for variant in args.variants.split(","):
        row = serve_variant(args, variant, bw, peak)
        if args.runner_steps:
            row["runner_batch1"] = runner_steps(args, variant)
        result["variants"].append(row)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
