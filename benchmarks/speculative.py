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

The simulated side: ``sim replay``'s model runs the same requests (their prompt and output
lengths as the server reported them) as the same closed loop (a request arrives when the
one before it on its client finished in the simulation, plus the client's measured gap),
priced by ``--profile`` (measured with ``engine profile`` first when left out, with verify
rows of every K). The acceptance is measured, the step costs come from the profile: each
speculating run is simulated with the histogram of that run (its workload, K and C), as
``/metrics`` counts it (``drafted``: the verify slots only), and with the decode slots that
carried no draft added as slots that accepted none (``decode``; the simulated drafter drafts
every slot). Reported: the speed-up (speculating over plain tokens/s) and the acceptance
rate in both worlds, and the simulator's relative errors. Servers and simulator run without
the prefix cache (each workload is sent once per C to the same server).
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
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from serving_load import MODEL, scrape, served, wait_idle, write_runs

from schema.traces.record import Trace, TraceRequest
from sim.config import build_config
from sim.costs.committed import profile_dtype
from sim.replay import build_costs, run_replay

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
PROFILE_GRID = (
    "--prefill-tokens", "32,128,512,1024", "--prefill-prefixes", "0", "--prefill-chunks", "1",
    "--decode-contexts", "64,512,1024", "--mixed-prefill", "128,512", "--mixed-prefixes", "0",
    "--repeats", "3", "--warmup", "1", "--holdout", "0",
)  # fmt: skip
"""The plans ``engine profile`` times when no ``--profile`` is given: the prompts' prefills,
decode and verify steps (``--verify-drafts`` of every K) at batches 1 .. C and contexts up to
the longest prompt and output, and the mixed steps of a closed loop at C > 1."""


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


def acceptance_figures(counts: dict[str, Any]) -> dict[str, float]:
    """Accepted over draft tokens, and accepted draft tokens per verify slot."""
    slots, drafts, accepted = (
        counts[k] for k in ("verify_slots", "draft_tokens", "accepted_tokens")
    )
    return {
        "acceptance_rate": accepted / drafts if drafts else float("nan"),
        "mean_accepted_length": accepted / slots if slots else float("nan"),
    }


def decode_slot_histogram(accepted_lengths: list[int], undrafted: int) -> list[int]:
    """The histogram over every decode slot: ``undrafted`` slots (no draft) accept none."""
    counts = accepted_lengths or [0]
    return [counts[0] + max(undrafted, 0), *counts[1:]]


def undrafted_slots(output_tokens: int, requests: int, spec: dict[str, Any]) -> int:
    """Decode slots that carried no draft: every decode slot gives one token plus its accepted
    drafts, the first token of each request comes from its prefill."""
    decode_slots = output_tokens - requests - spec["accepted_tokens"]
    return max(int(decode_slots - spec["verify_slots"]), 0)


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


def throughput(requests: list[dict[str, Any]]) -> dict[str, float]:
    """Output tokens/s over the run's span, and the per-request means."""
    tokens = sum(r["output_tokens"] for r in requests)
    span = max(r["finished"] for r in requests) - min(r["sent"] for r in requests)
    out = {"output_tokens": tokens, "span_s": span, "tokens_per_s": tokens / span}
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "tokens_per_s"):
        out[f"mean_{key}" if key != "tokens_per_s" else "mean_request_tokens_per_s"] = float(
            np.nanmean([r[key] for r in requests])
        )
    return out


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


# ---------------------------------------------------------------- the simulated side
def think_gaps(sent: list[float], finished: list[float], concurrency: int) -> list[float]:
    """Per request (in the order sent), the time its client took to send it after the
    request it follows finished: the ``j``-th sent follows the ``j - C``-th to finish (the
    first ``C`` follow the run's start)."""
    done = sorted(finished)
    return [s - (done[j - concurrency] if j >= concurrency else 0.0) for j, s in enumerate(sent)]


def closed_loop_arrivals(finished: list[float], gaps: list[float], concurrency: int) -> list[float]:
    """When each request of a closed loop of ``concurrency`` clients is sent, given when the
    requests finish and the clients' ``gaps`` (``think_gaps``' inverse)."""
    done = sorted(finished)
    return [g + (done[j - concurrency] if j >= concurrency else 0.0) for j, g in enumerate(gaps)]


def simulate(
    config: Any, costs: Any, real: list[dict[str, Any]], concurrency: int
) -> dict[str, Any]:
    """The requests of a real run (its lengths) through the simulator as the same closed loop:
    replayed until the arrivals are those its own finishes give (at most one pass a request)."""
    gaps = think_gaps([r["sent"] for r in real], [r["finished"] for r in real], concurrency)
    arrivals = [r["sent"] for r in real]
    for _ in range(len(real) + 1):
        order = sorted(range(len(real)), key=lambda j: arrivals[j])
        trace = Trace(
            path="speculative",
            format="jsonl",
            requests=[
                TraceRequest(
                    str(j), arrivals[j], real[j]["prompt_tokens"], real[j]["output_tokens"]
                )
                for j in order
            ],
        )
        result = run_replay(trace, config, costs=costs, progress=False)
        table = result.requests.set_index("rid").loc[[str(j) for j in range(len(real))]]
        finished = list(table["arrival"] + table["e2e_ms"] / 1e3)
        new = closed_loop_arrivals(finished, gaps, concurrency)
        converged = max(abs(a - b) for a, b in zip(new, arrivals, strict=True)) < 1e-9
        arrivals = new
        if converged:
            break
    requests = [
        {
            "sent": float(row.arrival), "finished": float(row.arrival + row.e2e_ms / 1e3),
            "output_tokens": int(row.output_tokens), "ttft_ms": float(row.ttft_ms),
            "tpot_ms": float(row.tpot_ms), "e2e_ms": float(row.e2e_ms),
            "tokens_per_s": float(row.output_tokens / (row.e2e_ms / 1e3)),
        }
        for row in table.itertuples()
    ]  # fmt: skip
    out: dict[str, Any] = {"requests": requests, **throughput(requests), "converged": converged}
    spec = result.summary.get("speculative", {})
    if spec.get("method", "none") != "none":
        keep = ("verify_slots", "draft_tokens", "accepted_tokens", "accepted_lengths", "acceptance")
        out["spec"] = {k: spec[k] for k in keep} | acceptance_figures(spec)
    return out


def sim_config(args: argparse.Namespace, profile: Path, k: int = 0, acceptance: str = "") -> Any:
    """The simulated server: the profile's table model, no prefix cache (as the servers run);
    with ``k``, speculating with ``acceptance`` (a file of the measured histogram)."""
    values = {"model": args.model, "profile": str(profile), "cost_model": "table",
              "dtype": profile_dtype(profile), "num_pages": args.num_pages,
              "prefix_cache": False, "seed": args.seed}  # fmt: skip
    if k:
        values |= {"speculative": "ngram", "num_draft_tokens": k, "acceptance": acceptance}
    return build_config(**values)


def measure_profile(args: argparse.Namespace) -> Path:
    """A profile of this machine (``PROFILE_GRID``), with verify rows of every K."""
    out: Path = args.out_dir / "profile.csv"
    batches = sorted({1, *args.concurrency})
    mixed = sorted({1, *(c - 1 for c in args.concurrency if c > 1)})
    cmd = [
        sys.executable, "-m", "lab.cli.engine", "profile", "--model", args.model,
        "--cpu-threads", str(args.threads), "--num-pages", str(args.num_pages), *PROFILE_GRID,
        "--decode-batches", ",".join(map(str, batches)),
        "--mixed-batches", ",".join(map(str, mixed)),
        "--verify-drafts", ",".join(map(str, args.k)),
        "--out", str(out), "--overwrite",
    ]  # fmt: skip
    print("+", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    return out


def speedup(spec: dict[str, Any], plain: dict[str, Any]) -> float:
    """Output tokens/s of the speculating run over the plain one's."""
    return float(spec["tokens_per_s"] / plain["tokens_per_s"])


def relative_error(sim: float, real: float) -> float:
    return sim / real - 1 if real else float("nan")


def one_case(args: argparse.Namespace, profile: Path, costs: Any, plain: dict[str, Any],
             spec: dict[str, Any], name: str, c: int, k: int) -> dict[str, Any]:  # fmt: skip
    """One workload at C with K: both worlds, the speed-up and the acceptance."""
    measured = spec["spec"]
    undrafted = undrafted_slots(spec["output_tokens"], len(spec["requests"]), measured)
    hists = {
        "drafted": measured["accepted_lengths"],
        "decode": decode_slot_histogram(measured["accepted_lengths"], undrafted),
    }
    sim_plain = simulate(sim_config(args, profile), costs, plain["requests"], c)
    sims: dict[str, Any] = {}
    for draw, hist in hists.items():
        if sum(hist) == 0:
            sims[draw] = {"skipped": "no verify slot measured"}
            continue
        path = args.out_dir / f"acceptance_{name}_c{c}_k{k}_{draw}.json"
        path.write_text(json.dumps({"accepted_lengths": hist, "num_draft_tokens": k}) + "\n")
        sim = simulate(sim_config(args, profile, k, str(path)), costs, spec["requests"], c)
        sim["acceptance_file"] = str(path)
        sim["speedup"] = speedup(sim, sim_plain)
        sim["error_speedup"] = relative_error(sim["speedup"], speedup(spec, plain))
        rate = sim["spec"]["acceptance_rate"]
        sim["error_acceptance_rate"] = relative_error(rate, measured["acceptance_rate"])
        sims[draw] = sim
    decode_slots = undrafted + measured["verify_slots"]
    real = {"plain": plain, "speculative": spec, "speedup": speedup(spec, plain)}
    real["drafted_share"] = measured["verify_slots"] / decode_slots if decode_slots else 0.0
    real["differences"] = differences(plain["requests"], spec["requests"])
    sim_ = {"plain": sim_plain, "speculative": sims}
    return {"workload": name, "concurrency": c, "num_draft_tokens": k, "real": real, "sim": sim_}


def print_table(cases: list[dict[str, Any]]) -> None:
    """The cases as markdown: real, simulated (``drafted`` histogram; ``decode`` beside it)."""
    print(
        "| workload | C | K | drafted | same tokens | plain tok/s real / sim | "
        "spec tok/s real / sim / sim (decode) | speed-up real | sim | err | sim (decode) | err "
        "| acceptance real | sim | err |"
    )
    print("|---" * 15 + "|")

    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for c in cases:
        real, sim = c["real"], c["sim"]
        d, e = sim["speculative"]["drafted"], sim["speculative"]["decode"]
        n = len(real["plain"]["requests"])
        cells = [
            c["workload"], c["concurrency"], c["num_draft_tokens"], f"{real['drafted_share']:.0%}",
            f"{n - len(real['differences'])}/{n}",
            f"{real['plain']['tokens_per_s']:.1f} / {sim['plain']['tokens_per_s']:.1f}",
            f"{real['speculative']['tokens_per_s']:.1f} / {f(d.get('tokens_per_s'), '.1f')} / "
            f"{f(e.get('tokens_per_s'), '.1f')}",
            f"{real['speedup']:.2f}x", f"{f(d.get('speedup'), '.2f')}x",
            f(d.get("error_speedup"), "+.1%"), f"{f(e.get('speedup'), '.2f')}x",
            f(e.get("error_speedup"), "+.1%"),
            f"{real['speculative']['spec']['acceptance_rate']:.2f}",
            f(d.get("spec", {}).get("acceptance_rate"), ".2f"),
            f(d.get("error_acceptance_rate"), "+.1%"),
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
