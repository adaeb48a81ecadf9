"""The simulated side of ``benchmarks/speculative.py``: its runs through ``sim replay``'s model.

The requests of a real run (their prompt and output lengths as the server
reported them) run as the same closed loop: a request arrives when the one
before it on its client finished in the simulation, plus the client's measured
gap. Priced by the profile (``measure_profile``: ``engine profile`` with verify
rows of every K, when none is given); a speculating run is simulated with one
acceptance model, that run's measurement: the histogram of accepted draft
tokens per verify slot and the share of decode slots that carried a draft
(``/metrics``), once per seed (``seed_means`` averages them). Also the figures
both sides are reduced to: output tokens/s, the acceptance, the speed-up and
relative errors; and the model's price of each real run's recorded steps, per kind
(``priced_steps``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from schema.traces.record import Trace, TraceRequest
from sim.config import build_config
from sim.costs.committed import profile_dtype
from sim.costs.recorded import shapes_of
from sim.replay import run_replay

PROFILE_GRID = (
    "--prefill-tokens", "32,128,512,1024", "--prefill-prefixes", "0", "--prefill-chunks", "1",
    "--decode-contexts", "64,512,1024", "--mixed-prefill", "128,512", "--mixed-prefixes", "0",
    "--repeats", "3", "--warmup", "1", "--holdout", "0",
)  # fmt: skip
"""The plans ``engine profile`` times when no ``--profile`` is given: the prompts' prefills,
decode and verify steps (``--verify-drafts`` of every K) at batches 1, every C and the powers
of two below the largest, and contexts up to
the longest prompt and output, and the mixed steps of a closed loop at C > 1."""


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


def acceptance_figures(counts: dict[str, Any]) -> dict[str, float]:
    """Accepted over draft tokens, accepted draft tokens per verify slot, and the share of
    decode slots that carried a draft (verify slots over verify and undrafted slots)."""
    slots, drafts, accepted, undrafted = (
        counts[k] for k in ("verify_slots", "draft_tokens", "accepted_tokens", "undrafted_slots")
    )
    return {
        "acceptance_rate": accepted / drafts if drafts else float("nan"),
        "mean_accepted_length": accepted / slots if slots else float("nan"),
        "draft_share": slots / (slots + undrafted) if slots + undrafted else float("nan"),
    }


def verify_steps(steps: Any) -> dict[str, float]:
    """Of a step record's steps (engine or simulated), those that verified drafts: how many,
    and their draft tokens on average. With overlap a request whose draft is in flight sits
    the next step out, so the running requests can split into groups that verify in turn;
    the mean shows how far they did."""
    verify = steps[steps["draft_tokens"] > 0]
    mean = float(verify["draft_tokens"].mean()) if len(verify) else float("nan")
    return {"steps": len(verify), "mean_draft_tokens": mean}


STEP_KINDS = ("decode", "verify", "chunk beside verify", "prefill or mixed")
"""The kinds of a speculating run's recorded steps that ``priced_steps`` tells apart."""


def priced_steps(steps: Any, gpu: Any) -> dict[str, dict[str, float]]:
    """A run's recorded steps against the cost model's price of their shapes, per kind: pure
    decodes, verify steps (every row sampled), steps that prefill a chunk beside verify spans,
    the rest. Recorded: the device time where the record has one (CUDA), else the forward's
    (``launched - enqueued``: on CPU the forward runs inside the launch); modelled: the model's
    device time, or step time, of each shape. Per kind: the steps, both times summed (ms)
    and the model's error on the sum."""
    if not len(steps):
        return {}
    device = steps["device_ms"].to_numpy(np.float64) / 1e3
    on_device = bool(np.isfinite(device).any())
    forward = (steps["launched"] - steps["enqueued"]).to_numpy(np.float64)
    recorded = device if on_device else forward
    price = gpu.device_time if on_device else gpu.step_time
    # a plain server's record has no draft column
    drafted = (
        steps["draft_tokens"].to_numpy() > 0 if "draft_tokens" in steps else [False] * len(steps)
    )
    kinds, modelled = [], []
    for shape, draft in zip(shapes_of(steps), drafted, strict=True):
        modelled.append(price(shape))
        if not shape.prefill_tokens:
            kinds.append("decode")
        elif not draft:
            kinds.append("prefill or mixed")
        elif shape.sampled == shape.prefill_tokens + shape.decode_requests:
            kinds.append("verify")
        else:
            kinds.append("chunk beside verify")
    kind, model = np.array(kinds), np.array(modelled)
    out = {}
    for name in STEP_KINDS:
        m = (kind == name) & np.isfinite(recorded)
        if m.any():
            total = float(recorded[m].sum())
            out[name] = {"steps": int(m.sum()), "recorded_ms": total * 1e3,
                         "model_ms": float(model[m].sum()) * 1e3,
                         "error": float(model[m].sum()) / total - 1}  # fmt: skip
    return out


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
        result = run_replay(trace, config, costs=costs, progress=False, record_steps=True)
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
        keep = ("verify_slots", "undrafted_slots", "draft_tokens", "accepted_tokens",
                "accepted_lengths", "tested_per_position", "acceptance")  # fmt: skip
        out["spec"] = {k: spec[k] for k in keep} | acceptance_figures(spec)
        out["spec"]["verify_steps"] = verify_steps(result.engine_steps)
    return out


def sim_config(
    args: argparse.Namespace,
    profile: Path,
    k: int = 0,
    acceptance: str = "",
    seed: int | None = None,
) -> Any:
    """The simulated server: the profile's table model, no prefix cache (as the servers run),
    overlap scheduling as the servers' cards say (``args.overlap``, once known); with ``k``,
    speculating with ``acceptance`` (a file of the measured histogram), its draws by ``seed``
    (default ``args.seed``)."""
    values = {"model": args.model, "profile": str(profile), "cost_model": "table",
              "dtype": profile_dtype(profile), "num_pages": args.num_pages,
              "prefix_cache": False, "seed": args.seed if seed is None else seed}  # fmt: skip
    if getattr(args, "overlap", None) is not None:
        values["overlap"] = args.overlap
    if k:
        values |= {"speculative": args.method, "num_draft_tokens": k, "acceptance": acceptance}
        if args.method == "self":
            values["draft_layers"] = args.draft_layers
    return build_config(**values)


def measure_profile(args: argparse.Namespace) -> Path:
    """A profile of this machine (``PROFILE_GRID``), with verify rows of every K."""
    out: Path = args.out_dir / "profile.csv"
    # every power of two below the largest C too: verify steps also run at batches below C
    # (as requests start and finish), and the table's knots sit at the measured batches
    top = max(args.concurrency)
    batches = sorted({1, *args.concurrency, *(2**i for i in range(top.bit_length()) if 2**i < top)})
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


def seed_means(
    runs: list[dict[str, Any]], seeds: list[int], plain: dict[str, Any]
) -> dict[str, Any]:
    """The first seed's simulated run (its requests, histogram and verify steps) with the
    figures the tables show replaced by their means over every seed's run, each seed's in
    ``seeds``: the drafter's choices and the acceptance are draws, and one set of them, keyed
    by request and position alike in every case, errs alike in every case."""
    per_seed = [
        {"seed": s, "tokens_per_s": r["tokens_per_s"], "speedup": speedup(r, plain),
         "acceptance_rate": r["spec"]["acceptance_rate"], "draft_share": r["spec"]["draft_share"]}
        for s, r in zip(seeds, runs, strict=True)
    ]  # fmt: skip
    out = runs[0] | {"seeds": per_seed}
    means = {k: float(np.mean([p[k] for p in per_seed])) for k in per_seed[0] if k != "seed"}
    out["tokens_per_s"], out["speedup"] = means["tokens_per_s"], means["speedup"]
    out["spec"] = runs[0]["spec"] | {k: means[k] for k in ("acceptance_rate", "draft_share")}
    return out


def relative_error(sim: float, real: float) -> float:
    return sim / real - 1 if real else float("nan")
