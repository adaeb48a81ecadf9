"""Microbenchmark: one ``schedule`` + ``complete`` step of the scheduler core with N decoding
requests (not a test), in strict alternation and overlapped (``schedule`` of step N+1 while
step N is in flight, then ``complete`` of step N). Writes a markdown table to stdout or ``--out``.

    python benchmarks/scheduler_step.py --requests 256 --out reports/sim_speed/scheduler_step.md
"""

from __future__ import annotations

import platform
import statistics
import sys
import time

from serving_load import parse_flags

from core.scheduler import Plan, Request, Scheduler, SchedulerConfig


def build(num_requests: int, prompt_len: int, page_size: int, prefix_cache: bool) -> Scheduler:
    pages_per_req = -(-(prompt_len + 4096) // page_size)
    s = Scheduler(
        SchedulerConfig(
            num_pages=num_requests * pages_per_req,
            page_size=page_size,
            max_running=num_requests,
            max_prefill_tokens=num_requests * prompt_len,
            prefix_cache=prefix_cache,
        )
    )
    for i in range(num_requests):
        prompt = [(i * 7919 + j) % 32000 for j in range(prompt_len)]
        s.add(Request(f"r{i}", prompt_len=prompt_len, prompt=prompt, max_new_tokens=4096))
    plan = s.schedule(0.0)  # one big prefill step puts every request in decode
    s.complete(plan, {rid: 1 for rid in plan.sampling_rids()})
    return s


def measure(s: Scheduler, steps: int, overlap: bool) -> list[float]:
    times = []
    now = 1.0
    prev: Plan | None = None
    for _ in range(steps):
        t0 = time.perf_counter()
        plan = s.schedule(now)
        done = prev if overlap else plan
        if done is not None:
            s.complete(done, {rid: 1 for rid in done.sampling_rids()})
        prev = plan
        times.append(time.perf_counter() - t0)
        now += 0.01
    if overlap and prev is not None:
        s.complete(prev, {rid: 1 for rid in prev.sampling_rids()})
    return times


def main() -> None:
    args = parse_flags(__doc__, requests=256, prompt_len=512, page_size=16, steps=2000, out="")

    rows = []
    for prefix_cache in (True, False):
        for overlap in (False, True):
            s = build(args.requests, args.prompt_len, args.page_size, prefix_cache)
            measure(s, 50, overlap)  # warm up
            us = sorted(t * 1e6 for t in measure(s, args.steps, overlap))
            mean = statistics.mean(us)
            rows.append((prefix_cache, overlap, mean, us[len(us) // 2], us[int(len(us) * 0.99)]))
        run_s = build(args.requests, args.prompt_len, args.page_size, prefix_cache)
        t0 = time.perf_counter()
        k = run_s.decode_run_length(args.steps)
        run_s.advance_decode(k)
        run_us = (time.perf_counter() - t0) * 1e6

    cmd = "python " + " ".join(sys.argv)
    lines = [
        "# Scheduler core: one decode step",
        "",
        f"One `schedule(now)` + `complete(plan, tokens)` with {args.requests} decoding requests",
        f"(prompt {args.prompt_len} tokens, page size {args.page_size}), {args.steps} steps",
        "measured after 50 warm-up steps; the context grows by one token per step, so a new",
        f"page is allocated for each request every {args.page_size} steps. Overlap on: each",
        "step schedules step N+1 while step N is in flight, then completes step N.",
        "",
        f"Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, {platform.system()}.",
        "",
        "| prefix cache | overlap | mean (us) | p50 (us) | p99 (us) | decode tokens/s of "
        "scheduling |",
        "|---|---|---|---|---|---|",
    ]
    for cache, overlap, mean, p50, p99 in rows:
        lines.append(
            f"| {'on' if cache else 'off'} | {'on' if overlap else 'off'} | {mean:.0f} | "
            f"{p50:.0f} | {p99:.0f} | {args.requests / (mean / 1e6):,.0f} |"
        )
    lines += [
        "",
        f"`advance_decode` of the same batch over {k} steps at once (the simulator's fast path): "
        f"{run_us:.0f} us in total, {run_us / max(k, 1):.1f} us per step.",
        "",
        f"Command: `{cmd}`",
        "",
    ]
    text = "\n".join(lines)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
