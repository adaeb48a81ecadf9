"""Decode step time and prefill MFU of the model runner, as fractions of measured ceilings.

Run on the GPU machine (after ``source scripts/gpu_env.sh``)::

    python3 benchmarks/gpu/runner.py --out $OUT/runner.json [--profile-dir $OUT]

In the same run it measures the machine's ceilings (device-to-device copy
bandwidth, dense bf16 matmul rate), then, for the Llama-3.1-8B shape with dummy
bf16 weights on the serving path (``ModelRunner.launch``: FlashInfer, CUDA graphs):

- decode steps at batch 1, 16, 64, 256 and contexts of 1k and 4k tokens (where the
  KV cache fits), each configuration after its own warm-up of both paths. ``sync``
  times one step at a time (host work + device work, the way a strictly alternating
  loop runs it), ``host_launch_s`` the part of it before ``launch`` returns;
  ``pipelined`` launches the steps back to back with each step's inputs read on the
  device from the previous step's samples (the way the overlapped loop runs it), by
  the wall clock and by CUDA events around each step's device work (``gpu_step_s``,
  and the idle gaps between steps). The roofline of a step is the bytes it must read
  (every weight but the embedding table, and the KV of every context position) over
  the copy bandwidth;
- prefill of one 8192-token chunk (and of 8192 tokens after an 8192-token prefix):
  model FLOPs (2 per matmul parameter per token, attention 4 * heads * head_dim per
  query-key pair, the LM head for the one sampled row) over time and the matmul peak.

``--variants base,fused`` measures the runner with FlashInfer's kernels, then with
QK-norm + rotary + KV write fused into one Triton kernel (``SERVELAB_FUSED_ROPE_STORE``),
in the same run against the same ceilings; ``slow-max`` is ``fused`` with FlashInfer's
``plan()`` left as it is (``SERVELAB_FLASHINFER_FAST_MAX=0``, see
``engine/attention/flashinfer_plan.py``). ``--profile-dir`` also writes, per variant,
torch profiler tables: device time by kernel of decode steps at batch 1 and 64 and of
one prefill chunk, host time by operation of sync decode steps at batch 1 and 256.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ceilings import ceilings_now, run_header

from core.scheduler import DecodeSlot, Plan, PrefillChunk, SchedulerConfig
from engine.runner import ModelRunner, RunnerArgs, StepInputs
from engine.runner.inputs import FROM_LAST_SAMPLE
from engine.runner.tp import TPLeader, follower_main
from engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
PAGE = 16


def weight_bytes(runner: ModelRunner) -> int:
    """Bytes of every parameter a decode step reads (all but the embedding table)."""
    total = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    embed = runner.model.model.embed_tokens.weight
    if runner.model.lm_head is None:  # tied: the table is read whole as the LM head
        return total
    return total - embed.numel() * embed.element_size()


def decode_plans(batch: int, context: int, steps: int) -> tuple[list[Plan], list[list[int]]]:
    pages_each = -(-(context + steps) // PAGE)
    tables = [tuple(range(i * pages_each, (i + 1) * pages_each)) for i in range(batch)]
    plans = []
    for s in range(steps):
        decode = tuple(DecodeSlot(f"r{i}", context - 1 + s, tables[i]) for i in range(batch))
        plans.append(Plan(s, decode=decode))
    return plans, [[1] * batch]


def time_decode(leader: TPLeader, batch: int, context: int, steps: int = 30) -> dict[str, Any]:
    """One configuration's step times, sync and pipelined, each after its own warm-up.

    ``sync``: one step at a time; ``host_launch_s`` is the part of it before
    ``launch`` returns (the host's work to issue the step). ``pipelined``: steps
    launched back to back, timed twice (the wall clock over the steps, and CUDA
    events around each step's device work: ``gpu_step_s`` and the idle gaps
    between steps). Every path is warmed up first (the first pipelined launch of a
    run loads the kernels that read inputs from the previous step's samples).
    """
    runner = leader.runner
    plans, _ = decode_plans(batch, context, steps + 20)
    sp = [GREEDY] * batch
    first = StepInputs([], [1] * batch, sp, [0] * batch)
    later = StepInputs([], [FROM_LAST_SAMPLE] * batch, sp, [0] * batch)
    leader.step(plans[0], first)
    for plan in plans[1:6]:  # warm-up, pipelined
        handle = leader.launch(plan, later)
    handle.tokens()
    sync, host = [], []
    for plan in plans[6:16]:
        t0 = time.perf_counter()
        handle = leader.launch(plan, first)
        t1 = time.perf_counter()
        handle.tokens()
        sync.append(time.perf_counter() - t0)
        host.append(t1 - t0)
    leader.step(plans[16], first)
    runner.step_events = []
    t0 = time.perf_counter()
    for plan in plans[17 : 17 + steps]:
        handle = leader.launch(plan, later)
    handle.tokens()
    pipelined = (time.perf_counter() - t0) / steps
    events, runner.step_events = runner.step_events, None
    gpu = [a.elapsed_time(b) / 1e3 for a, b in events]
    gaps = [b.elapsed_time(a) / 1e3 for (_, b), (a, _) in itertools.pairwise(events)]
    kv_bytes = runner.config.kv_bytes_per_token(2) * batch * (context + steps)
    roofline = (weight_bytes(runner) + kv_bytes) / CEILINGS["copy_bytes_per_s"]
    gpu_step = statistics.median(gpu)
    return {
        "batch": batch,
        "context": context,
        "sync_step_s": statistics.median(sync),
        "host_launch_s": statistics.median(host),
        "pipelined_step_s": pipelined,
        "gpu_step_s": gpu_step,
        "gpu_step_p10_s": statistics.quantiles(gpu, n=10)[0],
        "gpu_step_p90_s": statistics.quantiles(gpu, n=10)[-1],
        "gpu_idle_fraction": sum(gaps) / (sum(gaps) + sum(gpu[1:])),
        "roofline_step_s": roofline,
        "sync_roofline_fraction": roofline / statistics.median(sync),
        "pipelined_roofline_fraction": roofline / pipelined,
        "gpu_roofline_fraction": roofline / gpu_step,
        "host_launch_share_of_gpu_step": statistics.median(host) / gpu_step,
        "tokens_per_s": batch / pipelined,
    }


def prefill_flops(runner: ModelRunner, tokens: int, prefix: int) -> float:
    c = runner.config
    linear = sum(p.numel() for n, p in runner.model.named_parameters() if n.endswith("proj.weight"))
    pairs = tokens * prefix + tokens * (tokens + 1) // 2
    attention = 4 * c.num_layers * c.num_heads * c.head_dim * pairs
    return 2.0 * linear * tokens + attention + 2.0 * c.hidden_size * c.vocab_size


def time_prefill(leader: TPLeader, tokens: int, prefix: int) -> dict[str, Any]:
    total = prefix + tokens
    pages = tuple(range(-(-total // PAGE)))
    ids = [(7 * i) % 30000 + 1 for i in range(total)]
    times = []
    for rep in range(6):
        if prefix:
            chunk = PrefillChunk(f"p{rep}", 0, prefix, False, pages)
            leader.step(Plan(0, prefill=(chunk,)), StepInputs([ids[:prefix]], [], [], []))
        chunk = PrefillChunk(f"p{rep}", prefix, tokens, True, pages)
        plan = Plan(1, prefill=(chunk,))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        leader.step(plan, StepInputs([ids[prefix:]], [], [GREEDY], [0]))
        times.append(time.perf_counter() - t0)
    t = statistics.median(times[1:])
    flops = prefill_flops(leader.runner, tokens, prefix)
    return {
        "tokens": tokens,
        "prefix": prefix,
        "step_s": t,
        "tflops_per_s": flops / t / 1e12,
        "mfu_roofline_fraction": flops / t / CEILINGS["matmul_flops_per_s"],
    }


def profile(leader: TPLeader, out_dir: Path, tag: str, skip_prefill: bool) -> None:
    """Torch profiler tables: device time by kernel (decode at batch 1 and 64, one 8k prefill
    chunk) and host time by operation (sync decode steps at batch 1 and 256, by self CPU time).
    """
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    both = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    for batch, sort, name in (
        (1, "cuda_time_total", "decode_b1"),
        (64, "cuda_time_total", "decode_b64"),
        (1, "self_cpu_time_total", "host_b1"),
        (256, "self_cpu_time_total", "host_b256"),
    ):
        plans, _ = decode_plans(batch, 1024, 12)
        sp = [GREEDY] * batch
        inputs = StepInputs([], [1] * batch, sp, [0] * batch)
        leader.step(plans[0], inputs)
        with torch_profile(activities=both) as prof:
            for plan in plans[1:11]:
                leader.step(plan, inputs)
        table = prof.key_averages().table(sort_by=sort, row_limit=40)
        (out_dir / f"profile_{name}_{tag}.txt").write_text(table)
    if skip_prefill:
        return
    pages = tuple(range(512))
    chunk = PrefillChunk("prof", 0, 8192, True, pages)
    ids = [(7 * i) % 30000 + 1 for i in range(8192)]
    with torch_profile(activities=both) as prof:
        leader.step(Plan(0, prefill=(chunk,)), StepInputs([ids], [], [GREEDY], [0]))
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
    (out_dir / f"profile_prefill_8k_{tag}.txt").write_text(table)


CEILINGS: dict[str, float] = {}
VARIANTS = {  # the engine's switches for each variant
    "base": {"SERVELAB_FUSED_ROPE_STORE": "0", "SERVELAB_FLASHINFER_FAST_MAX": "1"},
    "fused": {"SERVELAB_FUSED_ROPE_STORE": "1", "SERVELAB_FLASHINFER_FAST_MAX": "1"},
    "slow-max": {"SERVELAB_FUSED_ROPE_STORE": "1", "SERVELAB_FLASHINFER_FAST_MAX": "0"},
}


def measure_variant(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """Build a runner for ``variant``, time every configuration, free it."""
    os.environ.update(VARIANTS[variant])
    t0 = time.perf_counter()
    runner_args = RunnerArgs(
        model=args.model,
        dummy_weights=True,
        device="cuda",
        scheduler=SchedulerConfig(num_pages=17500 // args.tp * args.tp, max_running=256),
        cuda_graph=not args.no_cuda_graph,
        tp_size=args.tp,
        dist_init=f"file:///tmp/bench-tp-{time.time_ns()}" if args.tp > 1 else "",
    )
    ctx = mp.get_context("spawn")
    followers = [
        ctx.Process(target=follower_main, args=(runner_args, r)) for r in range(1, args.tp)
    ]
    for f in followers:
        f.start()
    leader = TPLeader(runner_args)
    runner = leader.runner
    result: dict[str, Any] = {
        "variant": variant,
        "ops": runner.model.model.layers[0].self_attn.ops.name,
        "attention_backend": runner.backend_name,
        "cuda_graphs": runner.graphs is not None,
        "runner_start_s": time.perf_counter() - t0,
        "graph_capture_s": runner.graphs.capture_s if runner.graphs else None,
        "weight_bytes_per_decode_step": weight_bytes(runner),
        "decode": [],
        "prefill": [],
    }
    for context in (int(c) for c in args.contexts.split(",")):
        for batch in (int(b) for b in args.batches.split(",")):
            pages = batch * -(-(context + 50) // PAGE)
            if pages > runner.num_pages:
                result["decode"].append(
                    {"batch": batch, "context": context, "skipped": f"needs {pages} KV pages"}
                )
                continue
            row = time_decode(leader, batch, context)
            print(json.dumps({"variant": variant, **row}), flush=True)
            result["decode"].append(row)
    for prefix in () if args.skip_prefill else (0, 8192):
        row = time_prefill(leader, 8192, prefix)
        print(json.dumps({"variant": variant, **row}), flush=True)
        result["prefill"].append(row)
    if args.profile_dir:
        profile(leader, args.profile_dir, variant, args.skip_prefill)
    leader.shutdown()
    for f in followers:
        f.join(timeout=60)
    del leader, runner
    gc.collect()
    torch.cuda.empty_cache()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--profile-dir", type=Path)
    ap.add_argument("--no-cuda-graph", action="store_true")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (NCCL)")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--batches", default="1,16,64,256", help="decode batch sizes")
    ap.add_argument("--contexts", default="1024,4096", help="decode contexts")
    ap.add_argument(
        "--variants",
        default="fused",
        help="comma list, measured one after the other in this run: base (FlashInfer's "
        "kernels), fused (QK-norm + rotary + KV write in one Triton kernel; the engine default), "
        "slow-max (fused, with FlashInfer's plan() taking the longest sequence element by element)",
    )
    args = ap.parse_args()
    ceilings = ceilings_now()
    CEILINGS.update(
        copy_bytes_per_s=ceilings["copy"]["read_plus_write_bytes_per_s"],
        matmul_flops_per_s=ceilings["matmul_bf16"]["flops_per_s"],
    )
    print(json.dumps(CEILINGS), flush=True)
    result = run_header(
        torch=torch.__version__, model=args.model, tp=args.tp, ceilings=ceilings, variants=[]
    )
    for variant in args.variants.split(","):
        result["variants"].append(measure_variant(args, variant))
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
