"""16 concurrent requests through ``engine serve`` vs HF ``generate`` on the same prompts.

Runs both in one invocation on this machine's CPU, one after the other (never
at once), and writes a markdown table with the command into
``reports/cpu_speed/cpu_serving.md``. Every request generates exactly ``--max-tokens``
tokens (EOS ignored) so both sides do the same work.

    python benchmarks/cpu_serving.py --threads 2 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from serving_load import MODEL
from serving_load import served as serving

SUBJECTS = (
    "The sun", "A cat", "Python", "The ocean", "Music", "A good book", "Winter", "Paris",
    "The moon", "Coffee", "A forest", "Mathematics", "The internet", "Rain", "A bicycle", "Chess",
)  # fmt: skip


@dataclass
class Timed:
    ttft: float
    e2e: float
    tokens: int
    token_ids: list[int]


async def one_request(client: httpx.AsyncClient, ids: list[int], max_tokens: int) -> Timed:
    body = {
        "input_ids": ids,
        "stream": True,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
    }
    start = time.perf_counter()
    first = None
    out: list[int] = []
    async with client.stream("POST", "/generate", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["output_ids"] and first is None:
                first = time.perf_counter()
            out += chunk["output_ids"]
    end = time.perf_counter()
    return Timed(ttft=(first or end) - start, e2e=end - start, tokens=len(out), token_ids=out)


async def serve_all(
    url: str, prompts: list[list[int]], max_tokens: int
) -> tuple[list[Timed], float]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await one_request(client, prompts[0], 2)  # warm-up
        start = time.perf_counter()
        results = await asyncio.gather(*(one_request(client, p, max_tokens) for p in prompts))
        return list(results), time.perf_counter() - start


def hf_generate(
    model_dir: str, prompts: list[list[int]], max_tokens: int
) -> tuple[list[list[int]], float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = 0
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kwargs = dict(
        max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad
    )
    with torch.inference_mode():
        model.generate(
            input_ids=input_ids[:1],
            attention_mask=mask[:1],
            max_new_tokens=2,
            do_sample=False,
            pad_token_id=pad,
        )
        start = time.perf_counter()
        out = model.generate(input_ids=input_ids, attention_mask=mask, **kwargs)
        elapsed = time.perf_counter() - start
    return [row[width:].tolist() for row in out], elapsed


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads on both sides")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", default="reports/cpu_speed/cpu_serving.md")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from engine.models.setup import ensure_model

    torch.set_num_threads(args.threads)
    model_dir = str(ensure_model(MODEL))
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tok.encode(f"{s} is", add_special_tokens=False) for s in SUBJECTS]

    with serving(threads=args.threads) as (_, url):
        served, served_wall = asyncio.run(serve_all(url, prompts, args.max_tokens))
    hf_ids, hf_wall = hf_generate(model_dir, prompts, args.max_tokens)

    n_tokens = sum(r.tokens for r in served)
    same = sum(r.token_ids == h for r, h in zip(served, hf_ids, strict=True))
    ttfts = [r.ttft * 1000 for r in served]
    e2es = [r.e2e * 1000 for r in served]
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    lines = [
        "# CPU serving: engine serve vs HF generate",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{args.threads} torch threads on each side, model {MODEL} (float32). "
        f"{len(prompts)} prompts, {args.max_tokens} output tokens each (EOS ignored), greedy.",
        "",
        "| | wall time (s) | output tokens/s | TTFT p50 / p90 (ms) | E2E p50 / p90 (ms) |",
        "|---|---|---|---|---|",
        f"| engine serve, 16 concurrent streams over HTTP | {served_wall:.2f} | "
        f"{n_tokens / served_wall:.1f} | {pct(ttfts, 50):.0f} / {pct(ttfts, 90):.0f} | "
        f"{pct(e2es, 50):.0f} / {pct(e2es, 90):.0f} |",
        f"| HF `generate`, one padded batch of 16 | {hf_wall:.2f} | "
        f"{len(prompts) * args.max_tokens / hf_wall:.1f} | - | - |",
        "",
        f"Greedy outputs identical to HF for {same} of {len(prompts)} prompts "
        "(float32 CPU; batched kernels may differ in the last bits on near-ties).",
        "",
        "The server's time includes HTTP, SSE, tokenizer/detokenizer processes and ZeroMQ hops; "
        "HF's is the model loop alone in one process. Both ran on the same shared CPU, one after "
        "the other; absolute numbers vary with other load on the machine.",
        "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
