"""Measure the GPU ceilings the roofline cost model uses, on the machine it runs on.

Prints and writes JSON with: device-to-device copy bandwidth (bytes read + written per
second), dense bf16 matmul throughput, and the time one tiny kernel costs when launched
eagerly and when replayed from a CUDA graph (the per-kernel floor of a model step).

Run on a CUDA machine: ``python3 benchmarks/gpu/ceilings.py --out ceilings.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _time_cuda(fn: Callable[[], Any], iters: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def copy_bandwidth(nbytes: int) -> dict[str, float]:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = _time_cuda(lambda: dst.copy_(src), iters=10)
    t = statistics.median(times)
    return {"bytes_per_copy": nbytes, "median_s": t, "read_plus_write_bytes_per_s": 2 * nbytes / t}


def matmul_flops(n: int) -> dict[str, float]:
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    times = _time_cuda(lambda: a @ b, iters=10)
    t = statistics.mean(times)
    return {"n": n, "mean_s": t, "flops_per_s": 2 * n**3 / t}


def ceilings_now() -> dict[str, dict[str, float]]:
    """This GPU's copy bandwidth and dense bf16 matmul throughput, measured now (the
    ``ceilings`` of a benchmark's JSON)."""
    return {"copy": copy_bandwidth(4 << 30), "matmul_bf16": matmul_flops(8192)}


def run_header(**fields: Any) -> dict[str, Any]:
    """The head of a GPU benchmark's JSON: its command line, when and on which GPU it ran;
    then ``fields``."""
    return {
        "command": " ".join(["python3", *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        **fields,
    }


def kernel_launch(num_kernels: int) -> dict[str, float]:
    x = torch.zeros(1, device="cuda")

    def burst() -> None:
        for _ in range(num_kernels):
            x.add_(1.0)

    eager = statistics.median(_time_cuda(burst, iters=10))
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.stream(stream):
        burst()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        burst()
    replay = statistics.median(_time_cuda(graph.replay, iters=10))
    return {
        "num_kernels": num_kernels,
        "eager_s_per_kernel": eager / num_kernels,
        "graph_s_per_kernel": replay / num_kernels,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = run_header(
        torch=torch.__version__,
        host=platform.node(),
        **ceilings_now(),
        kernel_launch=kernel_launch(2000),
    )
    text = json.dumps(result, indent=2)
    print(text)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
