"""Compile (or load) every FlashInfer kernel the engine uses, in parallel; save the cache.

Run on the GPU machine after ``source scripts/gpu_env.sh``::

    python3 scripts/gpu_jit_warm.py --out $OUT/flashinfer-jit-sm90.tar.gz

Each module (paged attention for bf16 and head dim 128, RMSNorm, SiLU-and-mul,
rotary) is built by a small real call in its own process, so the four JIT
compilations overlap. The compiled ``*.so`` files go into the tarball; committed as
``gpu/flashinfer-jit-sm90.tar.gz``, ``scripts/gpu_env.sh`` loads them in later runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import time
from pathlib import Path

PARTS = ("attention", "norm", "activation", "rope")


def build(part: str) -> None:
    import torch

    from engine.attention.flashinfer_backend import FlashInferAttention
    from engine.attention.metadata import AttentionMetadata
    from engine.kvcache.pool import KVPool
    from engine.models.ops import FlashInferOps

    dev = torch.device("cuda")
    x = torch.randn(4, 256, dtype=torch.bfloat16, device=dev)
    ops = FlashInferOps()
    if part == "norm":
        ops.add_rms_norm(x, x.clone(), torch.ones(256, dtype=x.dtype, device=dev), 1e-5)
    elif part == "activation":
        ops.silu_and_mul(x)
    elif part == "rope":
        q = torch.randn(4, 2, 128, dtype=x.dtype, device=dev)
        cache = torch.randn(16, 128, dtype=torch.float32, device=dev)
        ops.rotary(torch.arange(4, device=dev), q, q.clone(), cache)
    else:
        pool = KVPool(1, 4, 16, 2, 128, torch.bfloat16, dev)
        attn = FlashInferAttention(pool, 4, 128**-0.5)
        one = torch.tensor([0, 1], dtype=torch.int32).pin_memory()
        meta = AttentionMetadata(
            0,
            one,
            one,
            one[1:],
            one[1:],
            torch.zeros(1, dtype=torch.int32, device=dev),
            torch.zeros(1, dtype=torch.int64, device=dev),
            16,
        )
        attn.prepare(meta)
        q = torch.randn(1, 4, 128, dtype=x.dtype, device=dev)
        kv = torch.randn(1, 2, 128, dtype=x.dtype, device=dev)
        attn.forward(0, q, kv, kv)
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--part", choices=PARTS)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.part:
        build(args.part)
        return
    start = time.perf_counter()
    procs = {p: subprocess.Popen([sys.executable, __file__, "--part", p]) for p in PARTS}
    failed = [p for p, proc in procs.items() if proc.wait() != 0]
    print(f"FlashInfer modules ready in {time.perf_counter() - start:.0f}s; failed: {failed}")
    from flashinfer.jit import env

    libs = sorted(env.FLASHINFER_JIT_DIR.glob("*/*.so"))
    if args.out and libs:
        with tarfile.open(args.out, "w:gz") as tar:
            for lib in libs:
                tar.add(lib, arcname=lib.name)
        print(f"{len(libs)} compiled modules -> {args.out} ({args.out.stat().st_size >> 20} MiB)")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
