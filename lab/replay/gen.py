"""``sim gen``: write a synthetic trace (JSONL) to replay."""

from __future__ import annotations

import argparse
from pathlib import Path

from schema.traces import generate


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gen", help="write a synthetic trace (JSONL)")
    p.add_argument(
        "--arrival", choices=["poisson", "gamma"], default="poisson", help="arrival process"
    )
    p.add_argument("--rate", type=float, required=True, help="mean requests per second")
    p.add_argument("--cv", type=float, default=1.0, help="gamma: coefficient of variation")
    p.add_argument("--input", required=True, help="fixed:N | uniform:A:B | empirical:TRACE")
    p.add_argument("--output", required=True, help="fixed:N | uniform:A:B | empirical:TRACE")
    p.add_argument("--num", type=int, required=True, help="requests to write")
    p.add_argument(
        "--prefix-groups",
        type=int,
        default=0,
        help="shared prefixes: each request draws one of G groups (0: none); G sets the reuse "
        "distance",
    )
    p.add_argument(
        "--prefix-len",
        default="fixed:0",
        help="tokens of each group's shared prefix, drawn once per group (whole 512-token "
        "blocks are shared): fixed:N | uniform:A:B | empirical:TRACE",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--out", type=Path, required=True, help="the trace file to write")
    p.set_defaults(func=cmd_gen)


def cmd_gen(args: argparse.Namespace) -> int:
    n = generate(
        args.out,
        arrival=args.arrival,
        rate=args.rate,
        input_spec=args.input,
        output_spec=args.output,
        num=args.num,
        seed=args.seed,
        cv=args.cv,
        prefix_groups=args.prefix_groups,
        prefix_len=args.prefix_len,
    )
    print(f"wrote {n} requests to {args.out}")
    return 0
