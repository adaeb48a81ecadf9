"""The A/B experiment of the process layouts: what a long text prompt (B) arriving mid-decode
costs a decoding request (A), per layout, in the engine and in the simulator, on CPU.

For each ``--max-prefill-tokens`` budget and each layout, starts ``engine serve --layout L
--record-steps``, streams A (a short prompt, greedy, EOS ignored, long enough to outlast B)
and, once A has streamed ``--a-tokens-before`` chunks, sends B: ``--b-tokens`` tokens of real
text (the source of standard-library modules, as ``inspect`` reads it), ``--b-max-tokens``
out. Recorded: A's chunk arrival times and B's TTFT (client side), the stage timestamps of
both (``return_meta_info``) and the server's step record. Then ``sim replay``'s model runs the
same two requests (the measured prompt lengths and arrival offset) in the same layout, priced
by ``--profile`` (measured with ``engine profile`` first when left out), twice: with the
profile's tokenize cost per token, and with the speed measured here on B's text.

A's pause is the largest gap between its consecutive tokens from B's arrival to B's first
token. Its step (the one that ends the gap) splits it: the time the scheduler's loop held
before scheduling it, above the loop's usual wait (tokenization, in ``inline``), the step's
time above a decode-only step's (B's prefill chunk), and the rest (a decode step, delivery).
The same split sums over B's whole life. Writes ``reports/layouts/layout_ab.json``.

    python benchmarks/layout_ab.py --b-tokens 4000 --budgets 512,4096
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import inspect
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
from serving_load import MODEL, Stream, served, stream_completion, write_runs

from engine.models.setup import resolve_model
from engine.tokenizer.prompt import load_tokenizer
from schema.layouts import LAYOUTS
from schema.steprecord import read_step_record
from schema.traces.record import Trace, TraceRequest
from sim.config import build_config
from sim.costs.committed import profile_dtype
from sim.replay import build_costs, run_replay

A_PROMPT = "The lighthouse keeper wrote in his log every night. Tonight he wrote:"
B_MODULES = (
    "argparse", "textwrap", "difflib", "calendar", "statistics", "fractions", "shlex",
    "string", "heapq", "bisect", "dataclasses", "enum", "functools", "inspect",
)  # fmt: skip
PROFILE_GRID = (
    "--prefill-tokens", "64,512,4096", "--prefill-prefixes", "0", "--prefill-chunks", "1",
    "--decode-batches", "1,2", "--decode-contexts", "64,512", "--mixed-prefill", "512",
    "--mixed-batches", "1", "--mixed-prefixes", "0,3072", "--mixed-contexts", "128",
    "--repeats", "2", "--warmup", "1", "--holdout", "0",
)  # fmt: skip
"""The plans ``engine profile`` times when no ``--profile`` is given: the steps of this
experiment (A's prefill and decodes, B's chunks of 512 tokens over B's prefix, or one of 4k)."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--model",
        default=MODEL,
        help="a converted model, or a preset with --serve-args "
        "--dummy-weights (the simulator's model preset too)",
    )
    p.add_argument("--tokenizer", help="B's tokenizer (default: the model's folder)")
    gpu = "'--device cuda --dummy-weights --tokenizer .gpu/tokenizer'"
    p.add_argument("--serve-args", default="", help=f"more engine serve flags; on a GPU: {gpu}")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated")
    p.add_argument("--budgets", default="512,4096", help="--max-prefill-tokens values")
    p.add_argument("--b-tokens", type=int, default=4000, help="B's prompt, in tokens")
    p.add_argument("--b-max-tokens", type=int, default=1, help="B's output tokens")
    p.add_argument("--a-tokens-before", type=int, default=8, help="A's chunks before B is sent")
    p.add_argument("--a-tokens-after", type=int, default=8, help="A's tokens past B's prefill")
    p.add_argument("--repeats", type=int, default=1, help="runs of each case (the spread)")
    p.add_argument("--threads", type=int, default=1, help="engine serve --cpu-threads")
    p.add_argument("--num-pages", type=int, default=1024, help="KV pages, server and simulator")
    p.add_argument(
        "--profile",
        type=Path,
        help="the server's profile (default: measure one first); a CUDA profile makes the "
        "simulation overlap its steps, as the engine does on CUDA",
    )
    p.add_argument(
        "--out-dir", type=Path, default=Path("out/layout_ab"), help="step records, profile"
    )
    p.add_argument(
        "--json", type=Path, default=Path("reports/layouts/layout_ab.json"), help="the results"
    )
    return p.parse_args()


def b_text(tokenizer: Any, tokens: int) -> tuple[str, list[str]]:
    """Real text of ``tokens`` tokens: the source of the first of ``B_MODULES``, cut at a
    token's end; and the modules it took."""
    text = ""
    for n, name in enumerate(B_MODULES, 1):
        text += inspect.getsource(importlib.import_module(name)) + "\n"
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        if len(enc["input_ids"]) >= tokens:
            return text[: enc["offset_mapping"][tokens - 1][1]], list(B_MODULES[:n])
    raise SystemExit(f"the modules hold fewer than {tokens} tokens")


def cold_speed(path: str, text: str, repeats: int = 5) -> float:
    """Seconds a token of one ``encode`` of ``text`` by a tokenizer that has not seen it (a
    fresh one each time: a server meets B's words for the first time, and the tokenizer's
    word cache makes a second encode of the same text faster), the median of ``repeats``."""
    times = []
    for _ in range(repeats):
        tokenizer = load_tokenizer(path)
        began = time.perf_counter()
        tokens = len(tokenizer.encode(text))
        times.append((time.perf_counter() - began) / tokens)
    return float(np.median(times))


def measure_profile(args: argparse.Namespace) -> Path:
    out = args.out_dir / "profile.csv"
    cmd = [
        sys.executable, "-m", "lab.cli.engine", "profile", "--model", args.model,
        "--cpu-threads", str(args.threads), "--num-pages", str(args.num_pages),
        *PROFILE_GRID, "--out", str(out), "--overwrite",
    ]  # fmt: skip
    print("+", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    return out


async def a_and_b(url: str, args: argparse.Namespace, text: str, a_max: int) -> dict[str, Any]:
    """A streamed; B sent once A has streamed ``a_tokens_before`` chunks. Times are epoch s."""
    common = {"temperature": 0, "ignore_eos": True, "return_meta_info": True}
    a_body = {"prompt": A_PROMPT, "max_tokens": a_max, **common}
    b_body = {"prompt": text, "max_tokens": args.b_max_tokens, **common}
    to_epoch = time.time() - time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=900) as client:
        a_sent = time.monotonic()
        a = Stream()
        a_task = asyncio.create_task(stream_completion(client, a_body, out=a))
        while len(a.chunk_times) < args.a_tokens_before and not a_task.done():
            await asyncio.sleep(0.002)
        b_sent = time.monotonic()
        b = await stream_completion(client, b_body)
        await a_task
    for s in (a, b):
        if s.error or not s.done:
            raise SystemExit(f"a request failed: {s.error}")
    assert a.meta_info is not None and b.meta_info is not None
    return {
        "a_sent": a_sent + to_epoch,
        "b_sent": b_sent + to_epoch,
        "a_chunks": [t + to_epoch for t in a.chunk_times],
        "b_first_chunk": b.chunk_times[0] + to_epoch,
        "a_meta": a.meta_info,
        "b_meta": b.meta_info,
    }


def pause(tokens: np.ndarray, steps: pd.DataFrame, arrival: float, first: float) -> dict[str, Any]:
    """A's gaps from B's ``arrival`` to B's ``first`` token (``tokens``: A's token times; all
    on one clock, seconds): the largest, and the one B's first chunk ends (in ``inline`` the
    one B's tokenization falls in), each split by the step that ends it; and the split summed
    over the steps of B's life. In ms."""
    done = steps["done"].to_numpy()
    start = steps["schedule_start"].to_numpy()
    prefill = steps["prefill_tokens"].to_numpy() > 0
    held = np.concatenate([[np.nan], start[1:] - done[:-1]])  # the loop before each step
    took = done - start
    base_held = float(np.nanmedian(held[~prefill]))
    base_took = float(np.median(took[~prefill]))
    tokenization = np.maximum(np.nan_to_num(held - base_held), 0.0)
    chunk = np.where(prefill, np.maximum(took - base_took, 0.0), 0.0)

    def split(end: float, gap: float) -> dict[str, float]:
        i = int(np.searchsorted(done, end + 1e-9, side="right")) - 1  # the step of the token
        out = {"gap_ms": gap * 1e3, "tokenization_ms": tokenization[i] * 1e3}
        out["prefill_ms"] = chunk[i] * 1e3
        out["rest_ms"] = out["gap_ms"] - out["tokenization_ms"] - out["prefill_ms"]
        return out

    gaps = np.diff(tokens)
    inside = np.flatnonzero((tokens[1:] > arrival) & (tokens[:-1] < first))
    largest = inside[np.argmax(gaps[inside])]
    span = (done > arrival) & (done <= first + 1e-9)
    span[0] = False  # A's prefill, when B arrived during it
    first_chunk = done[np.flatnonzero(span & prefill)[0]]  # B's first chunk, and before it
    after_first = int(np.searchsorted(tokens, first_chunk - 1e-9)) - 1  # its token's gap
    return {
        "largest": split(tokens[largest + 1], gaps[largest]),
        "first_chunk": split(tokens[after_first + 1], gaps[after_first]),
        "b_life_tokenization_ms": float(tokenization[span].sum() * 1e3),
        "b_life_prefill_ms": float(chunk[span].sum() * 1e3),
        "b_chunks": int((prefill & span).sum()),
        "a_gaps_ms": [round(g * 1e3, 3) for g in gaps[inside]],
        "decode_step_ms": base_took * 1e3,
    }


def sim_config(args: argparse.Namespace, profile: Path, layout: str, budget: int) -> Any:
    return build_config(
        model=args.model,
        profile=str(profile),
        cost_model="table",
        dtype=profile_dtype(profile),
        num_pages=args.num_pages,
        layout=layout,
        max_prefill_tokens=budget,
    )  # the loop follows the profile's device: strict on CPU, overlapped on CUDA


def delivered(steps: pd.DataFrame, overlap: bool) -> np.ndarray:
    """When each simulated step's tokens leave the loop: as its ``complete`` returns, at the
    step's end; with overlap not before the next step's launch, which the loop makes first
    (the engine's step record stamps ``done`` then; the simulator's, at the device's end)."""
    done = steps["done"].to_numpy()
    if not overlap:
        return done
    return np.append(np.maximum(done[:-1], steps["launched"].to_numpy()[1:]), done[-1])


def simulate(config: Any, run: dict[str, Any], tokenize: float | None) -> dict[str, Any]:
    """The two requests of ``run`` (its prompt and output lengths, B's arrival offset) through
    the simulator, tokenizing at ``tokenize`` s a token (None: the profile's)."""
    a, b = run["a_meta"], run["b_meta"]
    trace = Trace(
        path="layout_ab",
        format="jsonl",
        requests=[
            TraceRequest("A", 0.0, a["prompt_tokens"], a["completion_tokens"]),
            TraceRequest(
                "B", run["b_sent"] - run["a_sent"], b["prompt_tokens"], b["completion_tokens"]
            ),
        ],
    )
    gpu, cpu = build_costs(config)
    if tokenize is not None:
        cpu = dataclasses.replace(cpu, tokenize=tokenize)
    result = run_replay(trace, config, record_steps=True, costs=(gpu, cpu))
    req = result.requests.set_index("rid")
    steps = result.engine_steps
    assert steps is not None
    arrival, first = req.loc["B", "arrival"], req.loc["B", "server_first_token"]
    out = pause(delivered(steps, config.overlap), steps, arrival, first)  # A is in every step
    out["b_ttft_ms"] = float(req.loc["B", "ttft_ms"])
    out["b_tokenized_ms"] = float((req.loc["B", "tokenized"] - arrival) * 1e3)
    out["tokenize_us_per_token"] = cpu.tokenize * 1e6
    return out


def measure(
    args: argparse.Namespace, layout: str, budget: int, text: str, repeat: int
) -> dict[str, Any]:
    """One real run: the server in ``layout`` with ``budget``, A and B, its step record."""
    a_max = args.a_tokens_before + -(-args.b_tokens // budget) + args.a_tokens_after
    record = args.out_dir / f"steps_{layout}_{budget}_{repeat}.csv"
    serve_args = (
        "--layout", layout, "--max-prefill-tokens", str(budget),
        "--num-pages", str(args.num_pages), "--record-steps", str(record),
        *shlex.split(args.serve_args),
    )  # fmt: skip
    with served(*serve_args, threads=args.threads, model=args.model) as (_, url):
        run = asyncio.run(a_and_b(url, args, text, a_max))
    steps = read_step_record(record)
    run["steps"] = steps[steps["schedule_start"] >= run["a_meta"]["received"]]
    return run


def one_case(args: argparse.Namespace, profile: Path, layout: str, budget: int, text: str,
             speed: float, repeat: int) -> dict[str, Any]:  # fmt: skip
    run = measure(args, layout, budget, text, repeat)
    steps = run.pop("steps")
    b_sent, b_first = run["b_sent"], run["b_first_chunk"]
    real = pause(np.array(run["a_chunks"]), steps, b_sent, b_first)
    real["step_gap_ms"] = pause(steps["done"].to_numpy(), steps, b_sent, b_first)["largest"][
        "gap_ms"
    ]
    real["b_ttft_ms"] = (b_first - b_sent) * 1e3
    real["b_tokenized_ms"] = (run["b_meta"]["tokenized"] - run["b_meta"]["received"]) * 1e3
    config = sim_config(args, profile, layout, budget)
    sims = {"b_text": simulate(config, run, speed), "profile": simulate(config, run, None)}
    for sim in sims.values():
        sim["error_gap"] = sim["largest"]["gap_ms"] / real["largest"]["gap_ms"] - 1
        sim["error_b_ttft"] = sim["b_ttft_ms"] / real["b_ttft_ms"] - 1
    return {
        "layout": layout,
        "max_prefill_tokens": budget,
        "repeat": repeat,
        "b_prompt_tokens": run["b_meta"]["prompt_tokens"],
        "a_tokens": run["a_meta"]["completion_tokens"],
        "b_arrival_offset_s": b_sent - run["a_sent"],
        "real": real,
        "sim": sims,
    }


def print_table(cases: list[dict[str, Any]]) -> None:
    print(
        f"{'budget':>6} {'layout':>8} | {'A gap real':>10} {'sim':>7} {'err':>6} {'sim/prof':>8} | "
        f"{'tok real':>8} {'sim':>6} | {'prefill real':>12} {'sim':>7} | "
        f"{'B TTFT real':>11} {'sim':>7} {'err':>6}"
    )
    for c in cases:
        r, s, p = c["real"], c["sim"]["b_text"], c["sim"]["profile"]
        rl, sl = r["largest"], s["largest"]
        print(
            f"{c['max_prefill_tokens']:>6} {c['layout']:>8} | {rl['gap_ms']:>10.0f} "
            f"{sl['gap_ms']:>7.0f} {s['error_gap']:>+6.1%} {p['largest']['gap_ms']:>8.0f} | "
            f"{rl['tokenization_ms']:>8.1f} {sl['tokenization_ms']:>6.1f} | "
            f"{rl['prefill_ms']:>12.0f} {sl['prefill_ms']:>7.0f} | "
            f"{r['b_ttft_ms']:>11.0f} {s['b_ttft_ms']:>7.0f} {s['error_b_ttft']:>+6.1%}"
        )


def main() -> None:
    args = parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.tokenizer or str(resolve_model(args.model))
    text, modules = b_text(load_tokenizer(path), args.b_tokens)
    speed = cold_speed(path, text)  # encode, the servers' call, on words it has not seen
    source = f"the source of {', '.join(modules)} (Python {sys.version.split()[0]})"
    print(f"B: {args.b_tokens} tokens of {source}; tokenized at {speed * 1e6:.2f} us/token")
    profile = args.profile or measure_profile(args)
    cases = []
    for budget in (int(b) for b in args.budgets.split(",")):
        for repeat in range(args.repeats):
            for layout in args.layouts.split(","):
                cases.append(one_case(args, profile, layout, budget, text, speed, repeat))
                cases[-1] |= {
                    "profile": str(profile),
                    "b_text": source,
                    "b_text_tokenize_us_per_token": speed * 1e6,
                }
                print_table(cases[-1:])
    print_table(cases)
    write_runs(args.json, cases)


if __name__ == "__main__":
    main()
