"""``sim validate --capacity``: the real engine's capacity at given SLOs, beside the simulator's.

    sim validate TRACE --url URL --profile FILE --capacity --slo-ttft-ms T --slo-tpot-ms P
        [--attainment 0.99] [--tolerance 0.05] [--repeats 2] --out DIR

The real side searches as ``sim capacity`` does, with its code
(``lab.sweep.capacity.Bracket``): a probe is one ``engine bench`` run of the
trace at rate scale x (prompts new to the server's cache), and passes when the
fraction of all requests that meet both SLOs reaches ``--attainment``. The
bracket starts at 1 and doubles or halves (within ``REAL_SCALES``: a real run
at 1/16 of the rate takes 16 times the trace's span), then bisects
geometrically until hi / lo <= 1 + ``--tolerance``. Near the edge the real
attainment is noisy, so ``lo`` and ``hi`` are run again until each has
``--repeats`` runs. Then::

    capacity  = the highest probed scale below ``first_failing`` at which every run passed
    first_failing = the lowest probed scale at which every run failed (None: none did)

and the interval [capacity, first_failing] holds the scales whose runs
disagreed: the edge as far as the noise lets the runs place it. A repeat that
fails at ``lo`` widens the interval downwards; the bisection then goes on
inside it (at most ``MAX_ROUNDS`` times), so the interval closes again where
the probes allow.

``crossing`` (both sides) is where the attainment, averaged over a scale's
runs, falls through the target: interpolated linearly in the logarithm of the
scale between the highest scale at or above the target and the next probed
scale above it. It is the point estimate; the interval is its uncertainty.

The simulated side is ``sim capacity``'s search (``search_capacity``) over the
same requests, with the simulator's config as ``sim validate`` builds it (the
server's settings, the profile's ``table`` model), to the same tolerance.
``capacity.json`` holds both, ``rel_err`` = (sim - real) / real and
``rel_err_interval``, the error against the interval's two ends.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lab.sweep.capacity import Bracket, arrival_rate, crossing, search_capacity
from lab.sweep.executor import Serial
from lab.sweep.probes import Probe, RowCache, file_digest
from lab.sweep.sweep import Plan
from schema.traces import Trace, scale_trace
from sim.config import SimConfig

if TYPE_CHECKING:
    from lab.bench.server import ServerInfo

REAL_SCALES = (1 / 16, 16.0)
"""The real search's bounds on the rate scale."""
MAX_ROUNDS = 4
"""Bisections of a real search: the first, and those inside an interval that a repeat widened."""


def add_capacity_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--capacity",
        action="store_true",
        help="measure the engine's capacity at the SLOs by bisection over the rate scale, "
        "beside the simulator's (see lab/validate/capacity.py)",
    )
    p.add_argument("--slo-ttft-ms", type=float, help="TTFT objective (--capacity needs it)")
    p.add_argument("--slo-tpot-ms", type=float, help="TPOT objective (--capacity needs it)")
    p.add_argument(
        "--attainment",
        type=float,
        default=0.99,
        help="--capacity: fraction of requests that must meet both SLOs (0.99)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="--capacity: stop once the bracket's ratio is 1 + this or less (0.05)",
    )


def edge(runs: dict[float, list[float]], attainment: float) -> tuple[float, float | None]:
    """``capacity`` and ``first_failing`` of the module docstring (capacity 0: none passed)."""
    failing = [x for x, a in runs.items() if all(v < attainment for v in a)]
    high = min(failing, default=None)
    passing = [x for x, a in runs.items() if all(v >= attainment for v in a)]
    below = [x for x in passing if high is None or x < high]
    return max(below, default=0.0), high


def search_real(
    run: Callable[[float], float], attainment: float, tolerance: float, repeats: int
) -> dict[str, Any]:
    """Bisect with ``run(scale) -> attainment`` (one real run), repeat at the edge, and place
    the capacity (module docstring)."""
    bracket = Bracket(min_scale=REAL_SCALES[0], max_scale=REAL_SCALES[1])
    runs: dict[float, list[float]] = {}

    def probe(x: float) -> float:
        runs.setdefault(x, []).append(run(x))
        return runs[x][-1]

    for _ in range(MAX_ROUNDS):
        while (x := bracket.next_scale(tolerance)) is not None:
            row = {"status": "ok", "slo_attainment": probe(x), "error": ""}
            bracket.record(x, row, attainment)
        for x in (bracket.lo, bracket.hi):
            while x is not None and len(runs[x]) < repeats:
                probe(x)
        capacity, first_failing = edge(runs, attainment)
        mixed = [x for x in runs if x > capacity and any(v < attainment for v in runs[x])]
        if not capacity or not mixed or min(mixed) / capacity <= 1 + tolerance:
            break
        bracket = Bracket(capacity, min(mixed), min_scale=REAL_SCALES[0])
    return {
        "capacity": capacity,
        "first_failing": first_failing,
        "crossing": crossing({x: sum(a) / len(a) for x, a in runs.items()}, attainment),
        "probes": [
            {"rate_scale": x, "attainment": a, "passed": [v >= attainment for v in a]}
            for x, a in sorted(runs.items())
        ],
    }


def search_sim(
    trace: Trace, config: SimConfig, digest: str, attainment: float, tolerance: float
) -> dict[str, Any]:
    """``sim capacity``'s search of ``config`` on ``trace``, in this process."""
    values = config.to_dict()
    values.pop("resolved_num_pages")
    plan = Plan([{}], [Probe(values, 1.0, "validate")])
    (s,) = search_capacity(
        plan, trace, Serial(), RowCache(None), attainment=attainment, tolerance=tolerance,
        trace_digest=digest, progress=False,
    )  # fmt: skip
    mean = {x: float(r["slo_attainment"]) for x, r in s.rows.items() if r["status"] == "ok"}
    return {
        "capacity": s.lo or 0.0,
        "first_failing": s.hi,
        "crossing": crossing(mean, attainment),
        "error": s.error,
        "probes": [{"rate_scale": x, "attainment": r["slo_attainment"]} for x, r in s.rows.items()],
    }


def relative(sim: float | None, real: float | None) -> float | None:
    return (sim - real) / real if real and sim is not None else None


def capacity_answer(
    real: dict[str, Any], sim: dict[str, Any], rate: float, args: argparse.Namespace
) -> dict[str, Any]:
    """``capacity.json`` (module docstring)."""
    ends = [real["capacity"], real["first_failing"]]
    return {
        "slo_ttft_ms": args.slo_ttft_ms,
        "slo_tpot_ms": args.slo_tpot_ms,
        "attainment": args.attainment,
        "tolerance": args.tolerance,
        "repeats": args.repeats,
        "trace_rate": rate,
        "real": real | {"request_rate": real["capacity"] * rate},
        "sim": sim | {"request_rate": sim["capacity"] * rate},
        "rel_err": relative(sim["capacity"], real["capacity"]),
        "rel_err_interval": [relative(sim["capacity"], end) for end in ends],
        "rel_err_crossing": relative(sim["crossing"], real["crossing"]),
    }


def fmt_scale(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}x"


def format_capacity(answer: dict[str, Any]) -> str:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:+.1%}"

    real, sim = answer["real"], answer["sim"]
    high = real["first_failing"]
    runs = sum(len(p["attainment"]) for p in real["probes"])
    lo_err, hi_err = answer["rel_err_interval"]
    fail = sim["first_failing"]
    sim_edge = "no scale failed" if fail is None else f"first failing {fail:.3g}x"
    return "\n".join(
        [
            f"capacity at TTFT <= {answer['slo_ttft_ms']:g} ms and TPOT <= "
            f"{answer['slo_tpot_ms']:g} ms for {answer['attainment']:.1%} of requests "
            f"(x the trace's rate, {answer['trace_rate']:.3g} req/s):",
            f"  real       {real['capacity']:.3g}x (interval {real['capacity']:.3g}x - "
            f"{'-' if high is None else f'{high:.3g}x'}; {runs} runs at "
            f"{len(real['probes'])} scales)",
            f"  simulated  {sim['capacity']:.3g}x ({sim_edge})",
            f"  error      {pct(answer['rel_err'])} (against the interval's ends: "
            f"{pct(lo_err)} and {pct(hi_err)})",
            f"  crossing   real {fmt_scale(real['crossing'])}, simulated "
            f"{fmt_scale(sim['crossing'])}: {pct(answer['rel_err_crossing'])}",
        ]
    )


def bench_runner(
    args: argparse.Namespace, trace: Trace, info: ServerInfo
) -> Callable[[float], float]:
    """One real run of ``trace`` at a rate scale, written to ``OUT/real-xSCALE-N/``; its
    SLO attainment."""
    from lab.bench.client import Target
    from lab.bench.main import write_bench
    from lab.bench.prompts import PromptMaker, fresh_salt
    from lab.bench.run import run_bench, tokenizer_for

    tokenizer, folder = tokenizer_for(args.tokenizer, info)
    target = Target(info.url, info.model, info.ours)
    done: dict[float, int] = {}

    def run(scale: float) -> float:
        salt = fresh_salt()
        result = run_bench(
            scale_trace(trace, scale), target, PromptMaker(tokenizer, salt), progress=False,
            slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
            config={"server": info.owned_by, "tokenizer": folder, "prompt_salt": salt},
        )  # fmt: skip
        done[scale] = done.get(scale, 0) + 1
        write_bench(result, args.out / f"real-x{scale:.4g}-{done[scale]}", report=False,
                    timeline=False)  # fmt: skip
        attained = float(result.summary["goodput"]["attainment"])
        print(f"real run at {scale:.4g}x: {attained:.1%} of requests met both SLOs")
        return attained

    return run


def run_capacity(
    args: argparse.Namespace, trace: Trace, config: SimConfig, info: ServerInfo
) -> dict[str, Any]:
    """Both searches on ``trace``; ``capacity.json``'s content (without the run record)."""
    if args.slo_ttft_ms is None or args.slo_tpot_ms is None:
        raise ValueError("--capacity needs --slo-ttft-ms and --slo-tpot-ms")
    if not 0 < args.attainment <= 1 or not args.tolerance > 0:
        raise ValueError("--attainment must be in (0, 1] and --tolerance > 0")
    real = search_real(bench_runner(args, trace, info), args.attainment, args.tolerance,
                       args.repeats)  # fmt: skip
    sim = search_sim(trace, config, file_digest(args.trace), args.attainment, args.tolerance)
    return capacity_answer(real, sim, arrival_rate(trace), args)
