"""Prefill/decode disaggregation against colocated serving on the same servers, real beside
simulated: latencies, the KV transfer per request and goodput per server.

Two setups of two servers each behind ``engine router``: ``pd`` (``engine serve --role
prefill`` and ``--role decode`` behind ``--prefill``/``--decode``) and ``colocated`` (two
plain servers behind ``--worker``). For each setup and rate scale of ``--rates`` it runs
``sim validate TRACE --url ROUTER`` (``--repeats`` real runs and a simulation of what the
router's card names: a 1:1 disaggregated cluster, or two replicas), each to
``OUT/SETUP_xRATE/``. For ``pd`` it also reads the prefill server's transfer counters
before and after (``engine_kv_transfer_seconds_total`` over ``engine_kv_transfers_total``
ok: from the send to the acknowledgment) against the simulation's mean transfer.

Written to ``--json`` and printed as markdown: per setup and rate, TTFT, TPOT and E2E
P50/P90 real and simulated with the error, the transfer per request (``pd``), and goodput
per server within ``--slo-ttft-ms`` and ``--slo-tpot-ms`` (every real run's mean); per rate,
disaggregation's goodput gain over colocated, real and simulated. With ``--record-steps DIR``
each server records its steps (over all its rates) to ``DIR/SETUP_K_steps.csv`` (K 0: the
prefill server or the first worker; 1: the other), what ``sim colocation fit`` reads when the
two share a GPU.

    python benchmarks/pd_load.py --trace traces/azure_conv.csv --limit 30 --rates 0.02,0.06 \\
        --profile profiles/cpu-xeon-2core_smollm2-135m.csv --slo-ttft-ms 3000 \\
        --slo-tpot-ms 300 --out out/pd_load
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
from layout_load import point, wait_ready
from serving_load import MODEL, launched, served

from lab.validate.compare import lookup
from schema.metrics import summarize
from schema.samples import WeightedSamples

LATENCY_KEYS = [f"{m}.{q}" for m in ("ttft_ms", "tpot_ms", "e2e_ms") for q in ("p50", "p90")]
SETUPS = {"pd": (("--role", "prefill"), ("--role", "decode")), "colocated": ((), ())}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="a .jsonl or Azure .csv trace")
    p.add_argument("--profile", type=Path, required=True, help="the servers' profile CSV")
    p.add_argument("--rates", default="1", help="comma-separated rate scales of the trace (1)")
    p.add_argument("--limit", type=int, help="the trace's first N requests (default: all)")
    p.add_argument("--repeats", type=int, default=1, help="real runs per point (1)")
    p.add_argument("--setups", default="pd,colocated", help="comma-separated: pd, colocated")
    p.add_argument("--slo-ttft-ms", type=float, required=True, help="goodput's TTFT SLO")
    p.add_argument("--slo-tpot-ms", type=float, required=True, help="goodput's TPOT SLO")
    p.add_argument("--model", default=MODEL, help="engine serve --model")
    p.add_argument("--threads", type=int, default=1, help="engine serve --cpu-threads (1)")
    p.add_argument("--serve-args", default="", help="more engine serve flags (each server)")
    p.add_argument("--validate-args", default="", help="more sim validate flags")
    p.add_argument("--out", type=Path, default=Path("out/pd_load"), help="(out/pd_load)")
    p.add_argument("--record-steps", type=Path, help="a folder: each server's step record")
    p.add_argument("--json", type=Path, help="the results (default: OUT/pd_load.json)")
    args = p.parse_args(argv)
    for flag, path in (("--trace", args.trace), ("--profile", args.profile)):
        if not path.is_file():
            raise SystemExit(f"error: {flag}: no file {path}")
    try:
        args.rates = [float(v) for v in args.rates.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"error: --rates takes numbers, got {args.rates!r}") from None
    args.setups = [v.strip() for v in args.setups.split(",") if v.strip()]
    if not args.rates or min(args.rates) <= 0 or not set(args.setups) <= set(SETUPS):
        raise SystemExit(f"error: --rates > 0; --setups among {', '.join(SETUPS)}")
    args.json = args.json or args.out / "pd_load.json"
    return args


def counter(url: str, name: str, status: str | None = None) -> float:
    """The sum of ``name``'s samples on ``url``'s ``/metrics`` (with ``status`` if given)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and (status is None or f'status="{status}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def transfers(url: str) -> tuple[float, float]:
    """The prefill server's ok transfers so far, and their seconds."""
    return (
        counter(url, "engine_kv_transfers_total", "ok"),
        counter(url, "engine_kv_transfer_seconds_total"),
    )


def goodput(folder: Path, slo_ttft_ms: float, slo_tpot_ms: float) -> float:
    """Requests per second meeting both SLOs in the run written to ``folder``."""
    requests = pd.read_csv(folder / "requests.csv")
    requests["reason"] = requests["reason"].astype(object).fillna("").astype(str)
    summary = summarize(
        requests,
        WeightedSamples.of(np.zeros(0)),
        num_steps=0,
        prefix_hit_rate=0.0,
        slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms,
    )
    return float(summary["goodput"]["value"])


def validate(args: argparse.Namespace, url: str, rate: float, out: Path) -> int:
    cmd = [
        sys.executable,
        "-m",
        "lab.cli.sim",
        "validate",
        str(args.trace),
        "--url",
        url,
        "--profile",
        str(args.profile),
        "--rate-scale",
        str(rate),
        "--repeats",
        str(args.repeats),
        "--no-report",
        "--no-progress",
        "--out",
        str(out),
    ]
    if args.limit is not None:
        cmd += ["--limit", str(args.limit)]
    with (out / "validate.log").open("w") as log:
        cmd += shlex.split(args.validate_args)
        return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode


def run_setup(args: argparse.Namespace, setup: str) -> list[dict[str, Any]]:
    """Two servers of ``setup`` behind a router: a validation per rate scale."""
    flags = shlex.split(args.serve_args)
    points = []
    if args.record_steps is not None:
        args.record_steps.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        servers = []
        for k, role in enumerate(SETUPS[setup]):
            record: tuple[str, ...] = ()
            if args.record_steps is not None:
                record = ("--record-steps", str(args.record_steps / f"{setup}_{k}_steps.csv"))
            server = served(*role, *flags, *record, threads=args.threads, model=args.model)
            servers.append(stack.enter_context(server))
        for proc, url in servers:
            wait_ready(proc, url)
        urls = [url for _, url in servers]
        names = ("--prefill", "--decode") if setup == "pd" else ("--worker", "--worker")
        router = ("router", "--port", "0", "--log-level", "warning")
        _, url = stack.enter_context(launched(*router, names[0], urls[0], names[1], urls[1]))
        for rate in args.rates:
            out = args.out / f"{setup}_x{rate:g}"
            out.mkdir(parents=True, exist_ok=True)
            before = transfers(urls[0]) if setup == "pd" else (0.0, 0.0)
            start = time.monotonic()
            rc = validate(args, url, rate, out)
            base = {
                "setup": setup,
                "rate_scale": rate,
                "out": str(out),
                "wall_s": time.monotonic() - start,
            }
            print(f"{setup} x{rate:g}: {base['wall_s']:.0f} s", flush=True)
            if rc != 0:
                points.append(base | {"error": f"sim validate exited {rc}"})
                continue
            comparison = json.loads((out / "comparison.json").read_text())
            entry = base | point(comparison)
            for key in LATENCY_KEYS:
                e = lookup(comparison, key)
                entry["metrics"][key] = {k: e.get(k) for k in ("real", "sim", "rel_err")}
            reals = sorted(out.glob("real-*"))
            entry["goodput_per_server"] = {
                "real": float(
                    np.mean([goodput(r, args.slo_ttft_ms, args.slo_tpot_ms) for r in reals])
                )
                / 2,
                "sim": goodput(out / "sim", args.slo_ttft_ms, args.slo_tpot_ms) / 2,
            }
            if setup == "pd":
                after = transfers(urls[0])
                n, seconds = after[0] - before[0], after[1] - before[1]
                sim = json.loads((out / "sim" / "summary.json").read_text())["disaggregation"]
                real_mean = seconds / n if n else None
                sim_mean = sim["transfers"]["mean_s"]
                error = sim_mean / real_mean - 1 if real_mean and sim_mean is not None else None
                entry["transfer_s"] = {
                    "real": real_mean,
                    "sim": sim_mean,
                    "rel_err": error,
                    "real_count": n,
                    "sim_count": sim["transfers"]["count"],
                }
            points.append(entry)
    return points


def gains(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rate: disaggregation's goodput per server over colocated's, real and simulated."""
    out = []
    by = {(p["setup"], p["rate_scale"]): p for p in points if "error" not in p}
    for rate in sorted({r for _, r in by}):
        pd_, co = by.get(("pd", rate)), by.get(("colocated", rate))
        if pd_ is None or co is None:
            continue
        g = {
            w: (
                pd_["goodput_per_server"][w] / co["goodput_per_server"][w] - 1
                if co["goodput_per_server"][w]
                else None
            )
            for w in ("real", "sim")
        }
        agree = None
        if g["real"] is not None and g["sim"] is not None:
            agree = bool(np.sign(round(g["real"], 3)) == np.sign(round(g["sim"], 3)))
        out.append(
            {"rate_scale": rate, "gain_real": g["real"], "gain_sim": g["sim"], "same_sign": agree}
        )
    return out


def markdown(points: list[dict[str, Any]], gain: list[dict[str, Any]]) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x * 100:+.1f} %"

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:,.1f}"

    head = ["setup", "rate", *LATENCY_KEYS, "transfer ms", "goodput/server real", "sim"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in points:
        if "error" in p:
            lines.append(f"| {p['setup']} | {p['rate_scale']:g} | {p['error']} |")
            continue
        cells = [p["setup"], f"{p['rate_scale']:g}"]
        cells += [
            f"{num(p['metrics'][k]['real'])} / {num(p['metrics'][k]['sim'])} "
            f"({pct(p['metrics'][k]['rel_err'])})"
            for k in LATENCY_KEYS
        ]
        t = p.get("transfer_s")
        cells.append(
            "-"
            if t is None or t["real"] is None
            else f"{t['real'] * 1e3:.1f} / {t['sim'] * 1e3:.1f} ({pct(t['rel_err'])})"
        )
        g = p["goodput_per_server"]
        cells += [f"{g['real']:.4f}", f"{g['sim']:.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if gain:
        lines += [
            "",
            "| rate | goodput gain of pd, real | simulated | same sign |",
            "|---|---|---|---|",
        ]
        for g in gain:
            lines.append(
                f"| {g['rate_scale']:g} | {pct(g['gain_real'])} | {pct(g['gain_sim'])} | "
                f"{g['same_sign']} |"
            )
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    points = [p for setup in args.setups for p in run_setup(args, setup)]
    gain = gains(points)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    body = {"command": "python " + " ".join(sys.argv), "points": points, "gains": gain}
    args.json.write_text(json.dumps(body, indent=2) + "\n")
    print(markdown(points, gain))
    print(f"wrote {args.json}")
    return 0 if all("error" not in p for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
