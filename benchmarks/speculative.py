"""Speculative decoding's speed-up and acceptance on CPU, real beside simulated.

Two workloads of real text, built here: ``copy`` (code editing: the source of a standard-library
function, as ``inspect`` reads it, to be returned unchanged but for one small edit, where
prompt lookup drafts well) and ``chat`` (ordinary questions, where it rarely does); each a chat
completion, greedy, ``--max-tokens`` out. Each server (plain, then ``--speculative ngram
--num-draft-tokens K`` per ``--k``) is warmed up, then serves every workload once per
``--concurrency`` C as a closed loop: C clients, each sending the next request when its last
one finished (C = 1: one stream, where speculation pays). Measured per request (client side):
TTFT, TPOT, E2E, output tokens/s; per run: output tokens/s over its span; the output tokens
(log-probs' bytes) of the plain and the speculating server compared token for token; and the
acceptance from the deltas of ``/metrics`` (accepted over draft tokens, the histogram of
accepted draft tokens per verify slot).

The simulated side (``speculative_sim.py``): ``sim replay``'s model runs the same requests as
the same closed loop, priced by ``--profile`` (measured with ``engine profile`` first when left
out, with verify rows of every K). The acceptance is measured, the step costs come from the
profile: each speculating run is simulated with one acceptance model, that run's (its
workload, K and C) as ``/metrics`` counts it: the histogram of accepted draft tokens per
verify slot, and the share of decode slots that carried a draft (the simulated drafter
drafts that share of the slots). Reported: the speed-up (speculating over plain tokens/s)
and the acceptance rate in both worlds, and the simulator's relative errors. Servers and
simulator run without the prefix cache (each workload is sent once per C to the same server).
Writes ``--json`` (``reports/speculative/speculative_cpu.json``).

    python benchmarks/speculative.py --requests 8 --max-tokens 128 --k 2,4 --concurrency 1,4
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from serving_load import MODEL, scrape, served, wait_idle, write_runs
from speculative_sim import (
    acceptance_figures,
    measure_profile,
    relative_error,
    sim_config,
    simulate,
    speedup,
    throughput,
)

from sim.replay import build_costs

COPY_FUNCTIONS = (
    ("textwrap", "dedent"), ("difflib", "get_close_matches"), ("statistics", "median"),
    ("inspect", "cleandoc"), ("urllib.parse", "urljoin"), ("heapq", "nlargest"),
    ("statistics", "quantiles"), ("ipaddress", "collapse_addresses"), ("textwrap", "indent"),
    ("glob", "glob"), ("statistics", "variance"), ("string", "Template.substitute"),
)  # fmt: skip
"""The functions whose source the ``copy`` prompts hold (150 to 600 tokens each)."""
CHAT_PROMPTS = (
    "What are three good habits for getting better sleep?",
    "Explain in simple words why the sky is blue.",
    "Write a short poem about a cat watching the rain.",
    "What is the difference between a virus and a bacterium?",
    "Give me a recipe idea for a quick vegetarian dinner.",
    "How do airplanes stay in the air?",
    "Suggest a name for a small bakery and explain why.",
    "What should I pack for a weekend hiking trip?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "Why do leaves change color in autumn?",
    "How can I stay focused when studying at home?",
    "Describe the water cycle to a ten-year-old.",
)
WARMUP = "Count from one to twenty: one, two, three, four,"
"""The untimed request each server answers first (it drafts, so the verify path warms up)."""


@dataclass(frozen=True)
class Prompt:
    """One request of a workload: its user message, and where its text came from."""

    text: str
    source: str


def copy_prompts(n: int) -> list[Prompt]:
    """``n`` code-editing prompts: a function's source and one edit, renaming its first
    parameter (or, past the list's end, adding a docstring line)."""
    out = []
    for i in range(n):
        module, name = COPY_FUNCTIONS[i % len(COPY_FUNCTIONS)]
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        params = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
        if i < len(COPY_FUNCTIONS) and params:
            edit = f"rename the parameter `{params[0]}` to `{params[0]}_arg` everywhere"
        else:
            edit = "add the line `# Reviewed.` as the first line of its body"
        text = (
            f"Here is a Python function:\n\n```python\n{inspect.getsource(obj)}```\n\n"
            f"Return the whole function unchanged, except: {edit}. Reply with the code only."
        )
        out.append(Prompt(text, f"{module}.{name}: {edit}"))
    return out


def chat_prompts(n: int) -> list[Prompt]:
    """``n`` ordinary questions, cycling through ``CHAT_PROMPTS``."""
    return [Prompt(CHAT_PROMPTS[i % len(CHAT_PROMPTS)], "CHAT_PROMPTS") for i in range(n)]


WORKLOADS = {"copy": copy_prompts, "chat": chat_prompts}


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


class Help(argparse.RawTextHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module doc as written, and each flag's default."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=Help)
    p.add_argument("--model", default=MODEL, help="the served model (the simulator's preset too)")
    p.add_argument("--workloads", default="copy,chat", help="comma-separated: copy, chat")
    p.add_argument("--requests", type=int, default=8, help="requests per workload")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--k", type=ints, default="4", help="--num-draft-tokens values, e.g. 2,4")
    p.add_argument("--concurrency", type=ints, default="1", help="closed-loop clients, e.g. 1,4")
    p.add_argument("--ngram-max", type=int, default=3, help="engine serve --ngram-max")
    p.add_argument("--ngram-min", type=int, default=1, help="engine serve --ngram-min")
    p.add_argument("--threads", type=int, default=1, help="engine serve --cpu-threads")
    p.add_argument("--num-pages", type=int, default=1024, help="KV pages, server and simulator")
    p.add_argument("--serve-args", default="", help="more engine serve flags, for every server")
    p.add_argument("--seed", type=int, default=0, help="the simulator's acceptance draws")
    p.add_argument("--profile", type=Path, help="the server's profile; left out: measure one")
    out = Path("out/speculative")
    p.add_argument("--out-dir", type=Path, default=out, help="the profile, acceptance files")
    p.add_argument(
        "--json",
        type=Path,
        default=Path("reports/speculative/speculative_cpu.json"),
        help="the results",
    )
    return p.parse_args()


# ---------------------------------------------------------------- the real side
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
    url: str, model: str, prompts: list[Prompt], concurrency: int, max_tokens: int
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
                done[i] = await one_request(client, body(model, prompt, max_tokens), t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [done[i] for i in range(len(prompts))]


def body(model: str, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model, "messages": [{"role": "user", "content": prompt.text}],
        "max_tokens": max_tokens, "temperature": 0, "stream": True, "logprobs": True,
        "return_meta_info": True,
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


SPEC_COUNTERS = {
    "verify_slots": "engine_spec_decode_num_drafts_total",
    "undrafted_slots": "engine_spec_decode_num_undrafted_slots_total",
    "draft_tokens": "engine_spec_decode_num_draft_tokens_total",
    "accepted_tokens": "engine_spec_decode_num_accepted_tokens_total",
}


def acceptance_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What the server's drafts did between two scrapes: the counters and the histogram."""
    out: dict[str, Any] = {
        name: round(after.get(key, 0.0) - before.get(key, 0.0))
        for name, key in SPEC_COUNTERS.items()
    }
    hist_after, hist_before = accepted_histogram(after), accepted_histogram(before)
    hist_before += [0] * (len(hist_after) - len(hist_before))
    out["accepted_lengths"] = [a - b for a, b in zip(hist_after, hist_before, strict=True)]
    return out | acceptance_figures(out)


def run_server(
    args: argparse.Namespace, k: int, workloads: dict[str, list[Prompt]]
) -> dict[str, Any]:
    """One server (K = 0: plain): every workload at every concurrency, in order."""
    spec = ("--speculative", "ngram", "--num-draft-tokens", str(k),
            "--ngram-max", str(args.ngram_max), "--ngram-min", str(args.ngram_min))  # fmt: skip
    serve_args = ("--num-pages", str(args.num_pages), "--no-prefix-cache",
                  *(spec if k else ()), *shlex.split(args.serve_args))  # fmt: skip
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    with served(*serve_args, threads=args.threads, model=args.model) as (_, url):
        asyncio.run(closed_loop(url, args.model, [Prompt(WARMUP, "")], 1, 32))
        for name, prompts in workloads.items():
            for c in args.concurrency:
                before = settled(url)
                requests = asyncio.run(closed_loop(url, args.model, prompts, c, args.max_tokens))
                after = settled(url)
                runs[name, c] = {"requests": requests, **throughput(requests)}
                if k:
                    runs[name, c]["spec"] = acceptance_delta(before, after)
                print(
                    f"  {name} C={c} K={k}: {runs[name, c]['tokens_per_s']:.1f} tok/s", flush=True
                )
    return {"command": "engine serve " + " ".join(serve_args), "runs": runs}


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


# ---------------------------------------------------------------- both worlds
def one_case(args: argparse.Namespace, profile: Path, costs: Any, plain: dict[str, Any],
             spec: dict[str, Any], name: str, c: int, k: int) -> dict[str, Any]:  # fmt: skip
    """One workload at C with K: both worlds, the speed-up and the acceptance. The simulated
    run's acceptance model is the measured one: the histogram and the draft share."""
    measured = spec["spec"]
    sim_plain = simulate(sim_config(args, profile), costs, plain["requests"], c)
    sim: dict[str, Any]
    if sum(measured["accepted_lengths"]) == 0:
        sim = {"skipped": "no verify slot measured"}
    else:
        path = args.out_dir / f"acceptance_{name}_c{c}_k{k}.json"
        model = {"accepted_lengths": measured["accepted_lengths"], "num_draft_tokens": k,
                 "draft_share": measured["draft_share"]}  # fmt: skip
        path.write_text(json.dumps(model) + "\n")
        sim = simulate(sim_config(args, profile, k, str(path)), costs, spec["requests"], c)
        sim["acceptance_file"] = str(path)
        sim["speedup"] = speedup(sim, sim_plain)
        sim["error_speedup"] = relative_error(sim["speedup"], speedup(spec, plain))
        rate = sim["spec"]["acceptance_rate"]
        sim["error_acceptance_rate"] = relative_error(rate, measured["acceptance_rate"])
    real = {"plain": plain, "speculative": spec, "speedup": speedup(spec, plain)}
    real["differences"] = differences(plain["requests"], spec["requests"])
    sim_ = {"plain": sim_plain, "speculative": sim, "acceptance_model": ACCEPTANCE_MODEL}
    return {"workload": name, "concurrency": c, "num_draft_tokens": k, "real": real, "sim": sim_}


ACCEPTANCE_MODEL = (
    "the run's /metrics: accepted draft tokens per verify slot (histogram) and the share of "
    "decode slots that carried a draft"
)


def print_table(cases: list[dict[str, Any]]) -> None:
    """The cases as markdown, real beside simulated."""
    print(f"Simulated with the measured acceptance model: {ACCEPTANCE_MODEL}.\n")
    print(
        "| workload | C | K | drafted real / sim | same tokens | plain tok/s real / sim | "
        "spec tok/s real / sim | speed-up real | sim | err | acceptance real | sim | err |"
    )
    print("|---" * 13 + "|")

    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for c in cases:
        real, sim = c["real"], c["sim"]
        d = sim["speculative"]
        measured, drawn = real["speculative"]["spec"], d.get("spec", {})
        n = len(real["plain"]["requests"])
        cells = [
            c["workload"], c["concurrency"], c["num_draft_tokens"],
            f"{measured['draft_share']:.0%} / {f(drawn.get('draft_share'), '.0%')}",
            f"{n - len(real['differences'])}/{n}",
            f"{real['plain']['tokens_per_s']:.1f} / {sim['plain']['tokens_per_s']:.1f}",
            f"{real['speculative']['tokens_per_s']:.1f} / {f(d.get('tokens_per_s'), '.1f')}",
            f"{real['speedup']:.2f}x", f"{f(d.get('speedup'), '.2f')}x",
            f(d.get("error_speedup"), "+.1%"), f"{measured['acceptance_rate']:.2f}",
            f(drawn.get("acceptance_rate"), ".2f"), f(d.get("error_acceptance_rate"), "+.1%"),
        ]  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")


def main() -> None:
    args = parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    workloads = {w: WORKLOADS[w](args.requests) for w in args.workloads.split(",")}
    profile = args.profile or measure_profile(args)
    costs = build_costs(sim_config(args, profile))  # speculation does not change the prices
    servers = {}
    for k in [0, *args.k]:
        print(f"server K={k}" if k else "server plain", flush=True)
        servers[k] = run_server(args, k, workloads)
    settings = {
        key: getattr(args, key)
        for key in ("max_tokens", "requests", "threads", "num_pages", "ngram_max", "ngram_min",
                    "seed", "serve_args")
    }  # fmt: skip
    cases = []
    for name in workloads:
        for c in args.concurrency:
            plain = servers[0]["runs"][name, c]
            for k in args.k:
                case = one_case(
                    args, profile, costs, plain, servers[k]["runs"][name, c], name, c, k
                )
                cases.append(case)
                case |= {
                    "profile": str(profile),
                    "servers": [servers[0]["command"], servers[k]["command"]],
                    "settings": settings,
                    "prompts": [p.source for p in workloads[name]],
                }
    print_table(cases)
    write_runs(args.json, cases)


if __name__ == "__main__":
    main()
