"""The load sweep over process layouts: what ``engine serve --layout`` (and its tokenizer
worker count) does to throughput and latency under a trace's load, real beside simulated.

For each configuration of ``--layouts`` x ``--num-tokenizers`` (more than one tokenizer
worker only in ``split``; the other combinations are skipped, as the server refuses them)
starts ``engine serve --layout L --num-tokenizers N``, waits until it is healthy, runs
``sim validate TRACE`` against it once per rate scale of ``--rates`` (``--repeats`` real
runs and a simulation of the layout the server's card names), and stops it. Each
validation goes to ``OUT/L_nN_xX/`` (its printout to ``validate.log`` there).

Written to ``--json`` and printed as markdown, per configuration and rate: request and
output throughput, TTFT P50/P99, ITL P99 and TPOT P50, real and simulated, with the
simulator's relative error. Per rate, when more than one layout ran: the winner of each of
output throughput (highest), TTFT P99 and ITL P99 (lowest) in each world, and whether the
simulator picks the real one. A real winner is a tie when it and the runner-up differ by no
more than the real runs' spread (``comparison.json``'s noise, with two repeats or more) or
else ``--tie-pct``; the simulator agrees when it picks one of the tied. When more than one
tokenizer count ran: each count's output throughput gain over the smallest, real and
simulated, and the predicted gain's error in points.

    python benchmarks/layout_load.py --trace build/cpu_short.jsonl --limit 20 \\
        --rates 0.07,0.14 --layouts split,inline \\
        --profile profiles/cpu-epyc-2core_smollm2-135m.csv --repeats 1 --out out/layout_load
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from serving_load import MODEL, served

from lab.validate.compare import lookup
from schema.layouts import LAYOUTS

METRICS = {  # key in comparison.json -> column name
    "request_throughput": "req/s",
    "output_throughput": "tok/s",
    "ttft_ms.p50": "TTFT p50",
    "ttft_ms.p99": "TTFT p99",
    "itl_ms.p99": "ITL p99",
    "tpot_ms.p50": "TPOT p50",
}
WINNER_METRICS = {"output_throughput": True, "ttft_ms.p99": False, "itl_ms.p99": False}
"""The metrics a layout wins on, and whether higher is better."""
GAIN_METRIC = "output_throughput"


@dataclass(frozen=True)
class Config:
    """One server of the sweep."""

    layout: str
    num_tokenizers: int

    def label(self) -> str:
        return f"{self.layout}_n{self.num_tokenizers}"


def _list(text: str, kind: type[int] | type[float], flag: str) -> list[Any]:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"error: {flag} takes comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise SystemExit(f"error: {flag} takes positive numbers, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="a .jsonl or Azure .csv trace")
    p.add_argument("--profile", type=Path, required=True, help="the server's profile CSV")
    p.add_argument("--cpu-profile", type=Path, help="CPU stage costs (sim validate --cpu-profile)")
    p.add_argument(
        "--layouts", default=",".join(LAYOUTS), help=f"comma-separated (all): {', '.join(LAYOUTS)}"
    )
    p.add_argument("--num-tokenizers", default="1", help="comma-separated worker counts (1)")
    p.add_argument("--rates", default="1", help="comma-separated rate scales of the trace (1)")
    p.add_argument("--limit", type=int, help="the trace's first N requests (default: all)")
    p.add_argument(
        "--repeats", type=int, default=2, help="real runs per point (2+ measure their spread; 2)"
    )
    p.add_argument("--tie-pct", type=float, default=3.0, help="tie threshold %% with 1 repeat (3)")
    p.add_argument("--model", default=MODEL, help="engine serve --model")
    p.add_argument("--tokenizer", help="sim validate --tokenizer (the prompts')")
    p.add_argument(
        "--threads", type=int, default=1, help="engine serve --cpu-threads (1; 0: torch's default)"
    )
    gpu = "'--device cuda --dummy-weights --tokenizer .gpu/tokenizer'"
    p.add_argument("--serve-args", default="", help=f"more engine serve flags; on a GPU: {gpu}")
    p.add_argument(
        "--validate-args",
        default="",
        help="more sim validate flags, e.g. the server's scheduler flags",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("out/layout_load"),
        help="a validation per point (out/layout_load)",
    )
    p.add_argument("--json", type=Path, help="the results (default: OUT/layout_load.json)")
    args = p.parse_args(argv)
    for flag, path in (("--trace", args.trace), ("--profile", args.profile),
                       ("--cpu-profile", args.cpu_profile)):  # fmt: skip
        if path is not None and not path.is_file():
            raise SystemExit(f"error: {flag}: no file {path}")
    args.layouts = [v.strip() for v in args.layouts.split(",") if v.strip()]
    unknown = [v for v in args.layouts if v not in LAYOUTS]
    if unknown or not args.layouts:
        raise SystemExit(f"error: unknown layout {unknown or ''} (one of {', '.join(LAYOUTS)})")
    args.num_tokenizers = _list(args.num_tokenizers, int, "--num-tokenizers")
    args.rates = _list(args.rates, float, "--rates")
    if args.repeats < 1 or (args.limit is not None and args.limit < 1) or args.tie_pct < 0:
        raise SystemExit("error: --repeats and --limit must be >= 1, --tie-pct >= 0")
    args.json = args.json or args.out / "layout_load.json"
    return args


def configs(layouts: list[str], counts: list[int]) -> tuple[list[Config], list[str]]:
    """The servers of the sweep, and a note for each combination the server refuses."""
    keep, skipped = [], []
    for layout, n in itertools.product(layouts, counts):
        if n > 1 and layout != "split":
            skipped.append(f"skipped {layout} with {n} tokenizers: only split has workers")
        else:
            keep.append(Config(layout, n))
    return keep, skipped


def wait_ready(proc: subprocess.Popen[str], url: str, timeout: float = 300.0) -> None:
    """Until ``url`` answers ``/health``; exits when the server dies first or ``timeout``."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        with suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"error: engine serve at {url} not healthy in {timeout:.0f} s")
        time.sleep(0.5)
    raise SystemExit(f"error: engine serve exited ({proc.returncode}) before it was ready")


def validate_command(args: argparse.Namespace, config: Config, rate: float, url: str,
                     out: Path) -> list[str]:  # fmt: skip
    cmd = [
        sys.executable, "-m", "lab.cli.sim", "validate", str(args.trace), "--url", url,
        "--profile", str(args.profile), "--rate-scale", str(rate), "--repeats",
        str(args.repeats), "--num-tokenizers", str(config.num_tokenizers), "--no-report",
        "--no-progress", "--out", str(out),
    ]  # fmt: skip
    for flag, value in (("--limit", args.limit), ("--cpu-profile", args.cpu_profile),
                        ("--tokenizer", args.tokenizer)):  # fmt: skip
        if value is not None:
            cmd += [flag, str(value)]
    return cmd + shlex.split(args.validate_args)


def point(comparison: dict[str, Any]) -> dict[str, Any]:
    """The sweep's metrics of one ``comparison.json``: real, sim, rel_err, noise each."""
    metrics = {}
    for key in METRICS:
        e = lookup(comparison, key)
        metrics[key] = {k: e.get(k) for k in ("real", "sim", "rel_err", "noise")}
    regime = comparison.get("regime") or {}
    return {"metrics": metrics, "regime": {
        "real": regime.get("real"), "sim": (regime.get("sim") or {}).get("regime")}}  # fmt: skip


def run_config(args: argparse.Namespace, config: Config) -> list[dict[str, Any]]:
    """One server: a validation per rate scale."""
    serve_args = ("--layout", config.layout, "--num-tokenizers", str(config.num_tokenizers),
                  *shlex.split(args.serve_args))  # fmt: skip
    points = []
    with served(*serve_args, threads=args.threads, model=args.model) as (proc, url):
        wait_ready(proc, url)
        for rate in args.rates:
            out = args.out / f"{config.label()}_x{rate:g}"
            out.mkdir(parents=True, exist_ok=True)
            base = {"layout": config.layout, "num_tokenizers": config.num_tokenizers,
                    "rate_scale": rate, "out": str(out)}  # fmt: skip
            if proc.poll() is not None:
                points.append(base | {"error": f"engine serve exited ({proc.returncode})"})
                continue
            start = time.monotonic()
            with (out / "validate.log").open("w") as log:
                cmd = validate_command(args, config, rate, url, out)
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            wall = time.monotonic() - start
            print(f"{config.label()} x{rate:g}: {wall:.0f} s", flush=True)
            if rc != 0:
                tail = (out / "validate.log").read_text().strip().splitlines()[-1:]
                print(f"  sim validate failed ({rc}): {' '.join(tail)}", flush=True)
                points.append(base | {"error": f"sim validate exited {rc}", "wall_s": wall})
                continue
            comparison = json.loads((out / "comparison.json").read_text())
            points.append(base | {"wall_s": wall} | point(comparison))
    return points


def spread(a: float, b: float) -> float:
    """|a - b| over their mean, as ``comparison.json``'s noise measures two runs."""
    return abs(a - b) / ((a + b) / 2) if a + b else 0.0


def _best(values: dict[str, float], higher: bool, noise: dict[str, float]) -> list[str]:
    """The labels whose value is within the larger ``noise`` of the two (``spread``) of the
    best value, best first."""
    order = sorted(values, key=values.__getitem__, reverse=higher)
    top = order[0]
    return [k for k in order if spread(values[top], values[k]) <= max(noise[top], noise[k])]


def winner(entries: dict[str, dict[str, Any]], higher: bool, tie_pct: float) -> dict[str, Any]:
    """The best of ``entries`` (label -> a metric's real/sim/noise) in each world. A label ties
    with the best when the two differ by no more than the larger spread of their real runs
    (``tie_pct`` % for a label without one); ``tied`` holds every label that ties with the real
    best, ``sim_tied`` every label that ties with the simulated best (by the same spreads).
    ``agrees``: yes when the two sets are equal, partly when they meet, else no."""
    real = {k: e["real"] for k, e in entries.items() if e["real"] is not None}
    sim = {k: e["sim"] for k, e in entries.items() if e["sim"] is not None}
    noise = {
        k: tie_pct / 100 if e.get("noise") is None else float(e["noise"])
        for k, e in entries.items()
    }
    order = sorted(real, key=real.__getitem__, reverse=higher)
    tied = _best(real, higher, noise) if real else []
    sim_tied = _best(sim, higher, noise) if sim else []
    agrees = None
    if tied and sim_tied:
        meet = set(tied) & set(sim_tied)
        agrees = "yes" if set(tied) == set(sim_tied) else "partly" if meet else "no"
    from_runs = all(e.get("noise") is not None for e in entries.values())
    return {
        "real": order[0] if order else None,
        "runner_up": order[1] if len(order) > 1 else None,
        "difference": spread(real[order[0]], real[order[1]]) if len(order) > 1 else None,
        "threshold": max(noise.values()) if noise else None,
        "threshold_from": "real runs' spread" if from_runs else "--tie-pct",  # where none
        "tied": tied,
        "sim": sim_tied[0] if sim_tied else None,
        "sim_tied": sim_tied,
        "agrees": agrees,
    }


def winners(points: list[dict[str, Any]], tie_pct: float) -> list[dict[str, Any]]:
    """Per rate scale and winner metric, the winning configuration in each world."""
    out = []
    for rate in sorted({p["rate_scale"] for p in points}):
        here = [p for p in points if p["rate_scale"] == rate and "metrics" in p]
        for key, higher in WINNER_METRICS.items():
            entries = {label(p): p["metrics"][key] for p in here}
            out.append({"rate_scale": rate, "metric": key} | winner(entries, higher, tie_pct))
    return out


def label(p: dict[str, Any]) -> str:
    return Config(p["layout"], p["num_tokenizers"]).label()


def gains(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each tokenizer count's output throughput over the smallest count's, per layout and
    rate, real and simulated; ``error``: the simulated gain minus the real one."""
    out = []
    done = [p for p in points if "metrics" in p]
    for (layout, rate), group in itertools.groupby(
        sorted(done, key=lambda p: (p["layout"], p["rate_scale"], p["num_tokenizers"])),
        key=lambda p: (p["layout"], p["rate_scale"]),
    ):
        base, *rest = list(group)
        b = base["metrics"][GAIN_METRIC]
        for p in rest:
            m = p["metrics"][GAIN_METRIC]
            real = m["real"] / b["real"] - 1 if m["real"] and b["real"] else None
            sim = m["sim"] / b["sim"] - 1 if m["sim"] and b["sim"] else None
            error = sim - real if real is not None and sim is not None else None
            out.append({"layout": layout, "rate_scale": rate, "num_tokenizers": p["num_tokenizers"],
                        "over": base["num_tokenizers"], "real": real, "sim": sim,
                        "error": error})  # fmt: skip
    return out


def _num(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def points_table(points: list[dict[str, Any]]) -> str:
    """Per configuration and rate: each metric real, sim and error; the regimes."""
    head = ["layout", "N", "rate"]
    for name in METRICS.values():
        head += [f"{name} real", "sim", "err"]
    lines = [_row([*head, "regime real/sim"]), _row(["---"] * (len(head) + 1))]
    for p in points:
        cells = [p["layout"], str(p["num_tokenizers"]), f"{p['rate_scale']:g}"]
        if "metrics" not in p:
            lines.append(_row(cells + [p["error"]] + [""] * (len(head) - 3)))
            continue
        for key in METRICS:
            m = p["metrics"][key]
            fmt = ".3f" if key == "request_throughput" else ".1f" if "put" in key else ".0f"
            cells += [_num(m["real"], fmt), _num(m["sim"], fmt), _num(m["rel_err"], "+.1%")]
        regime = p["regime"]
        lines.append(_row([*cells, f"{regime['real'] or '-'}/{regime['sim'] or '-'}"]))
    return "\n".join(lines)


def _set(labels: list[str]) -> str:
    return "-" if not labels else labels[0] if len(labels) == 1 else "tie: " + ", ".join(labels)


def winners_table(rows: list[dict[str, Any]]) -> str:
    lines = [_row(["rate", "metric", "real winner", "runner-up", "difference", "tie within",
                   "sim winner", "sim agrees"]), _row(["---"] * 8)]  # fmt: skip
    for w in rows:
        within = f"{_num(w.get('threshold'), '.1%')} ({w['threshold_from']})" if w["real"] else "-"
        lines.append(_row([f"{w['rate_scale']:g}", METRICS[w["metric"]], _set(w["tied"]),
                           w.get("runner_up") or "-", _num(w.get("difference"), ".1%"), within,
                           _set(w["sim_tied"]), w["agrees"] or "-"]))  # fmt: skip
    return "\n".join(lines)


def gains_table(rows: list[dict[str, Any]]) -> str:
    lines = [_row(["layout", "rate", "N", "over N", "tok/s gain real", "sim", "error (points)"]),
             _row(["---"] * 7)]  # fmt: skip
    for g in rows:
        error = "-" if g["error"] is None else f"{g['error'] * 100:+.1f}"
        lines.append(_row([g["layout"], f"{g['rate_scale']:g}", str(g["num_tokenizers"]),
                           str(g["over"]), _num(g["real"], "+.1%"), _num(g["sim"], "+.1%"),
                           error]))  # fmt: skip
    return "\n".join(lines)


def summarize(points: list[dict[str, Any]], tie_pct: float) -> dict[str, Any]:
    """The winners (more than one layout ran) and the gains (more than one count ran)."""
    ran = [p for p in points if "metrics" in p]
    several_layouts = len({p["layout"] for p in ran}) > 1
    several_counts = len({p["num_tokenizers"] for p in ran}) > 1
    return {
        "winners": winners(points, tie_pct) if several_layouts else [],
        "gains": gains(points) if several_counts else [],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    todo, skipped = configs(args.layouts, args.num_tokenizers)
    for note in skipped:
        print(note)
    start = time.monotonic()
    points: list[dict[str, Any]] = []
    for config in todo:
        points += run_config(args, config)
    found = summarize(points, args.tie_pct)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": shlex.join(["python", *sys.argv]), "trace": str(args.trace),
              "profile": str(args.profile), "repeats": args.repeats, "limit": args.limit,
              "skipped": skipped, "wall_s": time.monotonic() - start, "points": points,
              **found}  # fmt: skip
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print("\n" + points_table(points))
    if found["winners"]:
        print("\n" + winners_table(found["winners"]))
    if found["gains"]:
        print("\n" + gains_table(found["gains"]))
    print(f"\nwrote {args.json} ({record['wall_s']:.0f} s)")
    return 0 if all("metrics" in p for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
