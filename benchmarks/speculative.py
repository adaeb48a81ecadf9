"""Speculative decoding's speed-up and acceptance, real beside simulated; where it stops paying.

Two workloads of real text, built here: ``copy`` (code editing: the source of a standard-library
function, as ``inspect`` reads it, to be returned unchanged but for one small edit, where
prompt lookup drafts well) and ``chat`` (ordinary questions, where it rarely does); each a chat
completion, greedy, ``--max-tokens`` out. Each server (plain, then ``--speculative METHOD
--num-draft-tokens K`` per ``--k``) is warmed up, then serves every workload once per
``--concurrency`` C as a closed loop: C clients, each sending the next request when its last
one finished (C = 1: one stream, where speculation pays). Measured per request (client side):
TTFT, TPOT, E2E, output tokens/s; per run: output tokens/s over its span; the output tokens
(log-probs' bytes) of the plain and the speculating server compared token for token; and the
acceptance from the deltas of ``/metrics`` (accepted over draft tokens, the histogram of
accepted draft tokens per verify slot). Per workload and K, the crossover: the smallest C
whose speculating output tokens/s fall below the plain server's (``crossovers`` in the JSON).

``--method ngram`` (the default) drafts by prompt lookup; ``--method self --draft-layers N``
with the served model's first N layers (the simulator prices those layers' time from the
profile's batch-1 decode steps). ``--method synthetic
--acceptance-rate R`` drafts K tokens every time and accepts them at the rates R, whatever
the model says (``engine serve --speculative synthetic``): for a GPU with dummy weights,
where only the verify step's cost means anything. Its output differs from plain decoding by
design, so the token-for-token comparison is skipped (and the JSON says so).

The simulated side (``speculative_sim.py``; ``--no-sim`` leaves it out): ``sim replay``'s
model runs the same requests as the same closed loop, priced by ``--profile`` (measured on CPU
with ``engine profile`` first when left out, with verify rows of every K). The acceptance is
measured, the step costs come from the profile: each speculating run is simulated with one
acceptance model, that run's (its workload, K and C) as ``/metrics`` counts it: the histogram
of accepted draft tokens per verify slot, and the share of decode slots that carried a draft
(the simulated drafter drafts that share of the slots), once per ``--sim-seeds`` seed (5):
which slots draft and how many drafts are accepted are draws, so the simulated figures are
the means over the seeds (each seed's in the JSON). Reported: the speed-up (speculating
over plain tokens/s) and the acceptance rate in both worlds, and the simulator's relative
errors. Servers and simulator run without the prefix cache (each workload is sent once per C
to the same server); the simulated servers overlap scheduling as the real ones' cards say.
Per speculating run, both worlds' step records give how many draft tokens a verify step
carried on average; per real run, the profile's model prices the steps it recorded, per kind
(decodes, verify steps, chunks prefilled beside verify spans, the rest: ``steps_priced``),
so a simulated speed-up's error can be traced to a kind of step. Writes ``--json``
(``reports/speculative/speculative_cpu.json``).
``--resimulate JSON`` runs no server: it simulates a saved run's requests again with
today's simulator (the run's profile, or ``--profile``).

    python benchmarks/speculative.py --requests 8 --max-tokens 128 --k 2,4 --concurrency 1,4
    python benchmarks/speculative.py --model qwen3-0.6b --tokenizer smollm2-135m \
        --serve-args "--device cuda --dummy-weights" --method synthetic --acceptance-rate 0.7 \
        --ignore-eos --workloads chat --requests 64 --concurrency 1,4,16,64 --no-sim \
        --json out/speculative/synthetic_gpu.json
    python benchmarks/speculative.py --resimulate reports/speculative/speculative_cpu.json \
        --profile reports/speculative/profile_cpu.csv
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
from pathlib import Path
from typing import Any

from serving_load import MODEL, write_runs
from speculative_real import Prompt, differences, run_server
from speculative_sim import (
    measure_profile,
    relative_error,
    seed_means,
    sim_config,
    simulate,
    speedup,
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
    p.add_argument("--tokenizer", help="engine serve --tokenizer (a known name or HF folder)")
    p.add_argument("--method", default="ngram", choices=("ngram", "self", "synthetic"),
                   help="engine serve --speculative of the speculating servers")  # fmt: skip
    p.add_argument("--acceptance-rate", help="synthetic: engine serve --acceptance-rate, e.g. 0.7")
    p.add_argument("--draft-layers", type=int, help="self: engine serve --draft-layers, e.g. 20")
    p.add_argument("--ignore-eos", action="store_true", help="every request --max-tokens out")
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
    p.add_argument(
        "--sim-seeds",
        type=int,
        default=5,
        help="simulate each speculating run with this many seeds (--seed and the next ones): "
        "its figures are their means, their spread in the JSON's `seeds`",
    )
    p.add_argument("--profile", type=Path, help="the server's profile; left out: measure one")
    sim_help = "the simulated side (on a GPU: with --profile of it, else --no-sim)"
    p.add_argument("--sim", action=argparse.BooleanOptionalAction, default=True, help=sim_help)
    out = Path("out/speculative")
    p.add_argument("--out-dir", type=Path, default=out, help="the profile, acceptance files")
    p.add_argument(
        "--json",
        type=Path,
        help="the results (default: reports/speculative/speculative_cpu.json, or with "
        "--resimulate out/speculative/resimulated.json)",
    )
    p.add_argument(
        "--resimulate",
        type=Path,
        metavar="JSON",
        help="no server runs: simulate the requests of a run this benchmark saved again, with "
        "today's simulator and the run's profile (or --profile); --model as the run's",
    )
    args = p.parse_args()
    if args.json is None:
        done = "out/speculative/resimulated.json" if args.resimulate else DEFAULT_JSON
        args.json = Path(done)
    if (args.method == "synthetic") != (args.acceptance_rate is not None):
        p.error("--acceptance-rate goes with --method synthetic, and only with it")
    if (args.method == "self") != (args.draft_layers is not None):
        p.error("--draft-layers goes with --method self, and only with it")
    return args


DEFAULT_JSON = "reports/speculative/speculative_cpu.json"


# ---------------------------------------------------------------- both worlds
SYNTHETIC_OUTPUT = "skipped: synthetic acceptance changes the output by design"


def one_case(args: argparse.Namespace, profile: Path | None, costs: Any, plain: dict[str, Any],
             spec: dict[str, Any], name: str, c: int, k: int) -> dict[str, Any]:  # fmt: skip
    """One workload at C with K: the real runs, the speed-up, the acceptance and, with a
    ``profile``, the simulated side."""
    real = {"plain": plain, "speculative": spec, "speedup": speedup(spec, plain)}
    if args.method == "synthetic":
        real |= {"differences": None, "output_check": SYNTHETIC_OUTPUT}
    else:
        real["differences"] = differences(plain["requests"], spec["requests"])
    case = {"workload": name, "concurrency": c, "num_draft_tokens": k, "real": real}
    if profile is not None:
        case["sim"] = simulated(args, profile, costs, plain, spec, f"{name}_c{c}_k{k}", c, k)
    return case


def simulated(args: argparse.Namespace, profile: Path, costs: Any, plain: dict[str, Any],
              spec: dict[str, Any], tag: str, c: int, k: int) -> dict[str, Any]:  # fmt: skip
    """The simulated side of one case; its acceptance model is the measured one: the
    histogram, the per-position tests and the draft share."""
    measured = spec["spec"]
    sim_plain = simulate(sim_config(args, profile), costs, plain["requests"], c)
    sim: dict[str, Any]
    if sum(measured["accepted_lengths"]) == 0:
        sim = {"skipped": "no verify slot measured"}
    else:
        path = args.out_dir / f"acceptance_{tag}.json"
        model = {"accepted_lengths": measured["accepted_lengths"], "num_draft_tokens": k,
                 "draft_share": measured["draft_share"],
                 "tested_per_position": measured.get("tested_per_position", [])}  # fmt: skip
        path.write_text(json.dumps(model) + "\n")
        seeds = range(args.seed, args.seed + max(1, args.sim_seeds))
        runs = [
            simulate(sim_config(args, profile, k, str(path), s), costs, spec["requests"], c)
            for s in seeds
        ]
        sim = seed_means(runs, list(seeds), sim_plain)
        sim["acceptance_file"] = str(path)
        sim["error_speedup"] = relative_error(sim["speedup"], speedup(spec, plain))
        rate = sim["spec"]["acceptance_rate"]
        sim["error_acceptance_rate"] = relative_error(rate, measured["acceptance_rate"])
    return {"plain": sim_plain, "speculative": sim, "acceptance_model": ACCEPTANCE_MODEL}


ACCEPTANCE_MODEL = (
    "the run's /metrics: accepted draft tokens per verify slot (histogram), verify slots by "
    "draft position tested, and the share of decode slots that carried a draft"
)


def crossovers(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and K, the smallest C at which the speculating server's output tokens/s
    fall below the plain server's (None: at no C measured), with the speed-up at every C."""
    out = []
    for name, k in dict.fromkeys((c["workload"], c["num_draft_tokens"]) for c in cases):
        runs = sorted(
            (c for c in cases if (c["workload"], c["num_draft_tokens"]) == (name, k)),
            key=lambda c: c["concurrency"],
        )
        slower = [c["concurrency"] for c in runs if c["real"]["speedup"] < 1.0]
        speedups = {c["concurrency"]: c["real"]["speedup"] for c in runs}
        out.append({"workload": name, "num_draft_tokens": k, "speedup_by_concurrency": speedups,
                    "crossover_concurrency": min(slower, default=None)})  # fmt: skip
    return out


def print_table(cases: list[dict[str, Any]]) -> None:
    """The cases as markdown, real beside simulated (``-`` without the simulated side)."""
    if any("sim" in c for c in cases):
        print(f"Simulated with the measured acceptance model: {ACCEPTANCE_MODEL}.\n")
    print(
        "| workload | C | K | drafted real / sim | draft tokens per verify step real / sim | "
        "same tokens | plain tok/s real / sim | spec tok/s real / sim | speed-up real | sim | "
        "err | acceptance real | sim | err |"
    )
    print("|---" * 14 + "|")

    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for c in cases:
        real, sim = c["real"], c.get("sim", {})
        d = sim.get("speculative", {})
        measured, drawn = real["speculative"]["spec"], d.get("spec", {})
        n = len(real["plain"]["requests"])
        same = "skipped" if real["differences"] is None else f"{n - len(real['differences'])}/{n}"
        cells = [
            c["workload"], c["concurrency"], c["num_draft_tokens"],
            f"{measured['draft_share']:.0%} / {f(drawn.get('draft_share'), '.0%')}",
            f"{f(measured.get('verify_steps', {}).get('mean_draft_tokens'), '.1f')} / "
            f"{f(drawn.get('verify_steps', {}).get('mean_draft_tokens'), '.1f')}", same,
            f"{real['plain']['tokens_per_s']:.1f} / "
            f"{f(sim.get('plain', {}).get('tokens_per_s'), '.1f')}",
            f"{real['speculative']['tokens_per_s']:.1f} / {f(d.get('tokens_per_s'), '.1f')}",
            f"{real['speedup']:.2f}x", f(d.get("speedup"), ".2f") + ("x" if "speedup" in d else ""),
            f(d.get("error_speedup"), "+.1%"), f"{measured['acceptance_rate']:.2f}",
            f(drawn.get("acceptance_rate"), ".2f"), f(d.get("error_acceptance_rate"), "+.1%"),
        ]  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")


def print_crossovers(rows: list[dict[str, Any]]) -> None:
    """The crossovers as markdown."""
    print("\n| workload | K | speed-up by C | crossover: smallest C with spec < plain tok/s |")
    print("|---" * 4 + "|")
    for r in rows:
        speedups = ", ".join(f"{c}: {x:.2f}x" for c, x in r["speedup_by_concurrency"].items())
        crossover = r["crossover_concurrency"]
        at = "none measured" if crossover is None else f"C = {crossover}"
        print(f"| {r['workload']} | {r['num_draft_tokens']} | {speedups} | {at} |")


def resimulate(args: argparse.Namespace) -> None:
    """The simulated side of every case of ``args.resimulate`` again, from its requests and
    measured acceptance (the simulated server as the run's settings say)."""
    saved = json.loads(args.resimulate.read_text())
    cases = []
    for case in saved["runs"]:
        settings = case["settings"]
        for key in ("model", "method", "draft_layers", "num_pages", "seed", "overlap"):
            if key in settings:
                setattr(args, key, settings[key])
        profile = args.profile or Path(case["profile"])
        costs = build_costs(sim_config(args, profile))
        real, c, k = case["real"], case["concurrency"], case["num_draft_tokens"]
        tag = f"{case['workload']}_c{c}_k{k}"
        case["sim"] = simulated(args, profile, costs, real["plain"], real["speculative"], tag, c, k)
        case["profile"] = str(profile)
        cases.append(case)
    print_table(cases)
    rows = crossovers(cases)
    print_crossovers(rows)
    source = {"file": str(args.resimulate), "command": saved["command"]}
    write_runs(args.json, cases, crossovers=rows, resimulated=source)


def main() -> None:
    args = parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.resimulate:
        resimulate(args)
        return
    workloads = {w: WORKLOADS[w](args.requests) for w in args.workloads.split(",")}
    profile = (args.profile or measure_profile(args)) if args.sim else None
    # speculation does not change the prices
    costs = build_costs(sim_config(args, profile)) if profile is not None else None
    servers = {}
    for k in [0, *args.k]:
        print(f"server K={k}" if k else "server plain", flush=True)
        servers[k] = run_server(args, k, workloads, None if costs is None else costs[0])
    args.overlap = servers[0]["overlap"]  # the simulated servers schedule as the real ones
    settings = {
        key: getattr(args, key)
        for key in ("max_tokens", "requests", "threads", "num_pages", "method", "acceptance_rate",
                    "draft_layers", "ngram_max", "ngram_min", "ignore_eos", "tokenizer", "seed",
                    "serve_args", "overlap", "model")
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
                    "profile": None if profile is None else str(profile),
                    "servers": [servers[0]["command"], servers[k]["command"]],
                    "settings": settings,
                    "prompts": [p.source for p in workloads[name]],
                }
    print_table(cases)
    rows = crossovers(cases)
    print_crossovers(rows)
    write_runs(args.json, cases, crossovers=rows)


if __name__ == "__main__":
    main()
