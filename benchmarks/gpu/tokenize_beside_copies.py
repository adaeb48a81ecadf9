"""The tokenizer's speed alone, beside pinned host memory, and beside host-to-device copies.

    python benchmarks/gpu/tokenize_beside_copies.py --tokenizer .gpu/tokenizer --out OUT.json

On the H200 every `sim validate` run with the host KV tier tokenized 17-73 % slower per
token than the run without it the same hour (`reports/kv_tier/README.md`). The
tokenizer worker is its own process and the tier's copies are DMA from pinned memory;
this separates what could link them. Three phases, in one process tree, each timing the
tokenization of the same `--tokens`-token prompt (`engine bench`'s prompt words) `--repeats`
times in this process:

- ``alone``: nothing else runs;
- ``pinned``: a child process holds `--pinned-gb` GB of pinned host memory (the tier's
  pool) and sleeps;
- ``copies``: the child copies `--copy-gb` GB chunks of that memory to the GPU in a loop,
  as the tier's loads do (about the host link's speed, 50 GB/s on the H200).

Writes the per-token medians (us) and the ratios to ``alone``. Needs CUDA for the last
two phases (without it, only ``alone``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 600


def hold(pinned_gb: float, copy_gb: float, ready: Any, stop: Any) -> None:
    """The child: pin ``pinned_gb`` GB, then copy ``copy_gb`` GB chunks to the GPU until told
    to stop (``copy_gb`` 0: only hold the memory)."""
    import torch

    pinned = torch.empty(int(pinned_gb * 2**30), dtype=torch.uint8, pin_memory=True)
    chunk = int(copy_gb * 2**30)
    device = torch.empty(chunk, dtype=torch.uint8, device="cuda") if chunk else None
    ready.set()
    offset = 0
    while not stop.is_set():
        if device is None:
            time.sleep(0.05)
            continue
        if offset + chunk > pinned.numel():
            offset = 0
        device.copy_(pinned[offset : offset + chunk], non_blocking=True)
        torch.cuda.synchronize()
        offset += chunk


def time_tokenizer(tokenizer: Any, text: str, repeats: int) -> tuple[float, int]:
    """Median seconds of one ``encode`` of ``text`` over ``repeats``, and its token count."""
    tokens = len(tokenizer.encode(text))
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        tokenizer.encode(text)
        times.append(time.perf_counter() - began)
    return statistics.median(times), tokens


def phase(tokenizer: Any, text: str, repeats: int, pinned_gb: float, copy_gb: float) -> float:
    """Per-token seconds with a child holding (and copying) pinned memory."""
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    child = ctx.Process(target=hold, args=(pinned_gb, copy_gb, ready, stop))
    child.start()
    try:
        if not ready.wait(READY_TIMEOUT_S) or not child.is_alive():
            raise RuntimeError(f"the child did not pin {pinned_gb} GB (exit code {child.exitcode})")
        seconds, tokens = time_tokenizer(tokenizer, text, repeats)
    finally:
        stop.set()
        child.join(60)
        if child.is_alive():
            child.kill()
    return seconds / tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder")
    p.add_argument("--tokens", type=int, default=9000, help="prompt length (the tier trace's)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--pinned-gb", type=float, default=48.0)
    p.add_argument("--copy-gb", type=float, default=1.0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from engine.tokenizer.prompt import load_tokenizer
    from lab.bench.prompts import PromptMaker
    from schema.traces import TraceRequest

    tokenizer = load_tokenizer(args.tokenizer)
    text = PromptMaker(tokenizer).text(TraceRequest("p", 0.0, args.tokens, 1))
    seconds, tokens = time_tokenizer(tokenizer, text, args.repeats)
    result: dict[str, Any] = {"tokens": tokens, "alone_us": seconds / tokens * 1e6}
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        for name, copy_gb in (("pinned", 0.0), ("copies", args.copy_gb)):
            per_token = phase(tokenizer, text, args.repeats, args.pinned_gb, copy_gb)
            result[f"{name}_us"] = per_token * 1e6
            result[f"{name}_ratio"] = result[f"{name}_us"] / result["alone_us"]
    else:
        result["note"] = "no CUDA: only the tokenizer alone was timed"
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
