"""The real side of ``benchmarks/speculative.py``: one server per K, its closed loops.

Each server (plain, then ``--speculative METHOD --num-draft-tokens K``) is warmed
up, then serves every workload once per concurrency C as a closed loop (C
clients, each sending the next request when its last one finished). Measured
per request (client side): TTFT, TPOT, E2E, output tokens/s and the output
tokens (their log-probs' bytes); per run: output tokens/s over its span,
the acceptance from the deltas of ``/metrics`` and, given a cost model, its
price of the run's recorded steps per kind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import time
from dataclasses import dataclass
from typing import Any

import httpx
from serving_load import scrape, served, wait_idle
from speculative_sim import acceptance_figures, priced_steps, throughput, verify_steps

from lab.bench.server import server_info
from schema.steprecord import read_step_record

WARMUP = "Count from one to twenty: one, two, three, four,"
"""The untimed request each server answers first (it drafts, so the verify path warms up)."""


@dataclass(frozen=True)
class Prompt:
    """One request of a workload: its user message, and where its text came from."""

    text: str
    source: str


async def one_request(client: httpx.AsyncClient, body: dict[str, Any], t0: float) -> dict[str, Any]:
    """A streamed chat completion; its token bytes, client times (s from ``t0``), lengths."""
    out: dict[str, Any] = {"sent": time.monotonic() - t0, "tokens": [], "token_chunks": []}
    text, meta = "", None
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise SystemExit(f"a request failed ({resp.status_code}): {resp.text}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise SystemExit(f"a request failed: {chunk['error']['message']}")
            meta = chunk.get("meta_info", meta)
            choice = chunk["choices"][0] if chunk["choices"] else {}
            tokens = ((choice.get("logprobs") or {}).get("content")) or []
            if tokens:
                out["token_chunks"].append(time.monotonic() - t0)
                out["tokens"] += [bytes(t["bytes"]).hex() for t in tokens]
                text += choice["delta"].get("content", "")
    assert meta is not None and out["token_chunks"], "the stream ended without tokens"
    first, last = out["token_chunks"][0], out["token_chunks"][-1]
    n = len(out["tokens"])
    out |= {
        "text": text,
        "prompt_tokens": meta["prompt_tokens"],
        "output_tokens": meta["completion_tokens"],
        "finished": last,
        "ttft_ms": (first - out["sent"]) * 1e3,
        "e2e_ms": (last - out["sent"]) * 1e3,
        "tpot_ms": (last - first) * 1e3 / (n - 1) if n > 1 else float("nan"),
    }
    out["tokens_per_s"] = n / (last - out["sent"])
    return out


async def closed_loop(
    url: str,
    model: str,
    prompts: list[Prompt],
    concurrency: int,
    max_tokens: int,
    ignore_eos: bool = False,
) -> list[dict[str, Any]]:
    """``prompts`` in order through ``concurrency`` clients, each sending the next when its
    last one finished; the requests in the order sent."""
    queue = list(enumerate(prompts))
    done: dict[int, dict[str, Any]] = {}
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=3600) as client:

        async def worker() -> None:
            while queue:
                i, prompt = queue.pop(0)
                request = body(model, prompt, max_tokens, ignore_eos)
                done[i] = await one_request(client, request, t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [done[i] for i in range(len(prompts))]


def body(model: str, prompt: Prompt, max_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    """A greedy streamed chat completion (``ignore_eos``: always ``max_tokens`` out)."""
    return {
        "model": model, "messages": [{"role": "user", "content": prompt.text}],
        "max_tokens": max_tokens, "temperature": 0, "stream": True, "logprobs": True,
        "return_meta_info": True, "ignore_eos": ignore_eos,
    }  # fmt: skip


def accepted_histogram(metrics: dict[str, float]) -> list[int]:
    """Verify slots by accepted draft tokens (0 .. K) from ``scrape``'s samples: the cumulative
    buckets of ``engine_spec_decode_accepted_length`` (empty: no such histogram)."""
    prefix = 'engine_spec_decode_accepted_length_bucket{le="'
    cumulative: dict[int, float] = {}
    for key, value in metrics.items():
        if key.startswith(prefix):
            le = key[len(prefix) :].split('"', 1)[0]
            if le != "+Inf":
                cumulative[int(float(le))] = value
    cum = [cumulative.get(n, 0.0) for n in range(max(cumulative, default=-1) + 1)]
    return [round(c - (cum[n - 1] if n else 0.0)) for n, c in enumerate(cum)]


def tested_per_position(metrics: dict[str, float]) -> list[int]:
    """Verify slots by draft position tested (from 0) from ``scrape``'s samples (empty: an
    engine without the counter)."""
    prefix = 'engine_spec_decode_num_tested_tokens_per_pos_total{position="'
    counts = {
        int(key[len(prefix) :].split('"', 1)[0]): value
        for key, value in metrics.items()
        if key.startswith(prefix)
    }
    return [round(counts.get(i, 0.0)) for i in range(max(counts, default=-1) + 1)]


SPEC_COUNTERS = {
    "verify_slots": "engine_spec_decode_num_drafts_total",
    "undrafted_slots": "engine_spec_decode_num_undrafted_slots_total",
    "draft_tokens": "engine_spec_decode_num_draft_tokens_total",
    "accepted_tokens": "engine_spec_decode_num_accepted_tokens_total",
}


def acceptance_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What the server's drafts did between two scrapes: the counters, the histogram and the
    per-position tests."""
    out: dict[str, Any] = {
        name: round(after.get(key, 0.0) - before.get(key, 0.0))
        for name, key in SPEC_COUNTERS.items()
    }
    hist_after, hist_before = accepted_histogram(after), accepted_histogram(before)
    hist_before += [0] * (len(hist_after) - len(hist_before))
    out["accepted_lengths"] = [a - b for a, b in zip(hist_after, hist_before, strict=True)]
    tested_after, tested_before = tested_per_position(after), tested_per_position(before)
    tested_before += [0] * (len(tested_after) - len(tested_before))
    out["tested_per_position"] = [a - b for a, b in zip(tested_after, tested_before, strict=True)]
    return out | acceptance_figures(out)


def speculative_args(args: argparse.Namespace, k: int) -> tuple[str, ...]:
    """The ``engine serve`` flags of the speculating server with ``k`` draft tokens."""
    spec = ("--speculative", args.method, "--num-draft-tokens", str(k))
    if args.method == "synthetic":
        return (*spec, "--acceptance-rate", args.acceptance_rate)
    if args.method == "self":
        return (*spec, "--draft-layers", str(args.draft_layers))
    return (*spec, "--ngram-max", str(args.ngram_max), "--ngram-min", str(args.ngram_min))


def run_server(
    args: argparse.Namespace, k: int, workloads: dict[str, list[Prompt]], gpu: Any = None
) -> dict[str, Any]:
    """One server (K = 0: plain): every workload at every concurrency, in order; with a
    cost model ``gpu``, each run's recorded steps priced by it (``steps_priced``)."""
    tokenizer = ("--tokenizer", args.tokenizer) if args.tokenizer else ()
    spec = speculative_args(args, k) if k else ()
    record = (args.out_dir / f"steps_k{k}.csv").resolve()
    record.unlink(missing_ok=True)
    serve_args = ("--num-pages", str(args.num_pages), "--no-prefix-cache", *tokenizer, *spec,
                  "--record-steps", str(record), *shlex.split(args.serve_args))  # fmt: skip
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    windows: dict[tuple[str, int], tuple[float, float]] = {}
    with served(*serve_args, threads=args.threads, model=args.model) as (_, url):
        overlap = server_info(url).overlap
        asyncio.run(closed_loop(url, args.model, [Prompt(WARMUP, "")], 1, 32))
        for name, prompts in workloads.items():
            for c in args.concurrency:
                before = settled(url)
                began = time.time()
                requests = asyncio.run(
                    closed_loop(url, args.model, prompts, c, args.max_tokens, args.ignore_eos)
                )
                windows[name, c] = (began, time.time())
                after = settled(url)
                runs[name, c] = {"requests": requests, **throughput(requests)}
                if k:
                    runs[name, c]["spec"] = acceptance_delta(before, after)
                print(
                    f"  {name} C={c} K={k}: {runs[name, c]['tokens_per_s']:.1f} tok/s", flush=True
                )
    steps = read_step_record(record)
    for key, (began, ended) in windows.items():
        mine = steps[(steps["launched"] >= began) & (steps["launched"] <= ended)]
        if k:
            runs[key]["spec"]["verify_steps"] = verify_steps(mine)
        if gpu is not None:
            runs[key]["steps_priced"] = priced = priced_steps(mine, gpu)
            errors = ", ".join(f"{kind} {row['error']:+.1%} ({row['steps']})"
                               for kind, row in priced.items())  # fmt: skip
            print(f"  {key[0]} C={key[1]} K={k}, the model on the recorded steps: {errors}")
    return {"command": "engine serve " + " ".join(serve_args), "runs": runs, "overlap": overlap}


def settled(url: str) -> dict[str, float]:
    """``/metrics`` once the server is idle and its scheduler's last counters have arrived
    (it sends them when it goes idle, which may follow the frontend's end of a request)."""
    metrics = wait_idle(url)
    while True:
        time.sleep(0.3)
        again = scrape(url)
        spec = [k for k in again if k.startswith("engine_spec_decode")]
        if all(metrics.get(k) == again[k] for k in spec):
            return again
        metrics = again


def differences(plain: list[dict[str, Any]], spec: list[dict[str, Any]]) -> list[dict[str, int]]:
    """Requests whose output tokens differ, each with the first position that differs."""
    out = []
    for i, (a, b) in enumerate(zip(plain, spec, strict=True)):
        if a["tokens"] != b["tokens"]:
            first = next(
                (
                    j
                    for j, (x, y) in enumerate(zip(a["tokens"], b["tokens"], strict=False))
                    if x != y
                ),
                min(len(a["tokens"]), len(b["tokens"])),
            )
            out.append({"request": i, "first_difference": first})
    return out
