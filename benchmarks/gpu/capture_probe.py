"""Where the time of capturing decode CUDA graphs goes (a diagnostic, run on the GPU machine).

    python3 benchmarks/gpu/capture_probe.py [--model qwen3-0.6b] [--max-bs 16] [--no-pdl]

Builds the runner without graphs, then captures the graphs of batch sizes up to
``--max-bs`` under cProfile and prints the seconds per batch size (warm-up,
capture) and the calls that took the time. ``--no-pdl`` launches FlashInfer's
kernels without programmatic dependent launch, to compare.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from core.scheduler import SchedulerConfig
from engine.runner import ModelRunner, RunnerArgs
from engine.runner.graphs import StepGraphs


def first_calls() -> None:
    """Time the first and second matmul of a new shape (cuBLAS picks its kernel on first use)."""
    w = torch.randn(14336, 4096, dtype=torch.bfloat16, device="cuda")
    for m in (3, 5, 7, 9):
        x = torch.randn(m, 4096, dtype=torch.bfloat16, device="cuda")
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, w)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        print(f"linear M={m}: first {times[0] * 1e3:.1f} ms, second {times[1] * 1e3:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--max-bs", type=int, default=16)
    ap.add_argument("--no-pdl", action="store_true")
    args = ap.parse_args()
    if args.no_pdl:
        import flashinfer.activation
        import flashinfer.decode
        import flashinfer.norm
        import flashinfer.prefill

        for module in (
            flashinfer.activation,
            flashinfer.decode,
            flashinfer.norm,
            flashinfer.prefill,
        ):
            module.device_support_pdl = lambda device: False  # type: ignore[attr-defined]
    first_calls()
    t0 = time.perf_counter()
    runner = ModelRunner(
        RunnerArgs(
            model=args.model,
            dummy_weights=True,
            device="cuda",
            scheduler=SchedulerConfig(num_pages=4096, max_running=args.max_bs),
            cuda_graph=False,
        )
    )
    print(f"runner without graphs: {time.perf_counter() - t0:.1f}s", flush=True)
    graphs = StepGraphs(
        runner.model, runner.attention, runner.kv, args.max_bs, runner.max_pages_per_seq
    )
    profiler = cProfile.Profile()
    profiler.enable()
    seconds = graphs.capture()
    profiler.disable()
    torch.cuda.synchronize()
    print(f"captured {graphs.sizes} in {seconds:.1f}s (pdl {'off' if args.no_pdl else 'on'})")
    for bs, (warm, capture) in sorted(graphs.capture_s.items()):
        print(f"  bs {bs}: warm-up {warm:.2f}s, capture {capture:.2f}s")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
