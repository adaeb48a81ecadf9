"""Keep the requests of a random share of a Mooncake trace's conversations, every turn of each.

A conversation is the requests whose first --key-blocks prefix hash ids agree
(in the Mooncake conversation trace every prompt starts with the same block, and
the second names the conversation). Sampling whole conversations keeps their
turns, so the prefix reuse of a multi-turn conversation survives while the trace
gets shorter: a time window of the same length would keep the reuse distance (a
median of ~380 requests between a block's uses in that trace) and lose most
hits. Conversations of one request are dropped unless --keep-single.
--max-input N keeps only the conversations whose every prompt fits in N tokens
(a small model's context, or a CPU replica's time), before the share is drawn.
The lines are kept as they are but for the timestamp, moved so that the first
kept request arrives at 0; replay the sample at a --rate-scale to set the load.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from schema.traces.record import TraceError
from schema.traces.window import from_zero

EXAMPLE = """example:
  sim trace conversations traces/mooncake_conversation.jsonl --fraction 0.02 --seed 1 \\
      --out build/mooncake_conv2pct.jsonl"""


def conversation_key(line: str, key_blocks: int) -> tuple[int, ...]:
    """The first ``key_blocks`` prefix hash ids of a JSONL request line."""
    hash_ids = json.loads(line).get("hash_ids") or []
    return tuple(hash_ids[:key_blocks])


def sample(lines: list[str], fraction: float, seed: int, key_blocks: int,
           keep_single: bool, max_input: int | None = None) -> list[str]:  # fmt: skip
    """The lines of a ``fraction`` of the conversations (drawn with ``seed``), in order; with
    ``max_input``, of those whose every prompt has at most that many tokens."""
    keys = [conversation_key(line, key_blocks) for line in lines]
    sizes: dict[tuple[int, ...], int] = {}
    longest: dict[tuple[int, ...], int] = {}
    for line, k in zip(lines, keys, strict=True):
        sizes[k] = sizes.get(k, 0) + 1
        if max_input is not None:
            longest[k] = max(longest.get(k, 0), int(json.loads(line)["input_length"]))
    rng = random.Random(seed)
    eligible = [  # first-appearance order
        k for k in sizes
        if (keep_single or sizes[k] > 1) and (max_input is None or longest[k] <= max_input)
    ]  # fmt: skip
    picked = {k for k in eligible if rng.random() < fraction}
    return [line for line, k in zip(lines, keys, strict=True) if k in picked]


def read_lines(trace: Path) -> list[str]:
    """The request lines of a JSONL trace, each ending in a newline."""
    if trace.suffix != ".jsonl":
        raise TraceError(trace, None, "conversations need prefix hash ids, a .jsonl trace")
    if not trace.is_file():
        raise TraceError(trace, None, "no such trace file")
    with trace.open(encoding="utf-8") as f:
        return [line if line.endswith("\n") else line + "\n" for line in f if line.strip()]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim trace conversations``: its flags and its handler."""
    p = sub.add_parser(
        "conversations",
        help="keep a random share of a Mooncake trace's conversations, every turn of each",
        description=__doc__,
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=Path, help="a Mooncake-format .jsonl trace")
    p.add_argument("--fraction", type=float, required=True, help="share of conversations kept")
    p.add_argument("--seed", type=int, default=0, help="the draw's seed (default 0)")
    p.add_argument("--key-blocks", type=int, default=2, help="hash ids that name a conversation")
    p.add_argument("--keep-single", action="store_true", help="also one-request conversations")
    p.add_argument("--max-input", type=int, help="only conversations whose prompts all fit")
    p.add_argument("--out", type=Path, required=True, help="the sampled trace (.jsonl)")
    p.set_defaults(func=run)


def kept_lines(args: argparse.Namespace) -> list[str]:
    """The kept lines, after checking the flags and reading the trace."""
    if not 0 < args.fraction <= 1 or args.key_blocks < 1:
        raise ValueError("need 0 < --fraction <= 1 and --key-blocks >= 1")
    if args.max_input is not None and args.max_input < 1:
        raise ValueError("need --max-input >= 1")
    lines = read_lines(args.trace)
    try:
        kept = sample(lines, args.fraction, args.seed, args.key_blocks, args.keep_single,
                      args.max_input)  # fmt: skip
    except (KeyError, TypeError, AttributeError):
        raise TraceError(args.trace, None, "a line is not a Mooncake request") from None
    if not kept:
        raise ValueError("no conversation kept: raise --fraction")
    return from_zero(args.trace, kept)


def run(args: argparse.Namespace) -> int:
    try:
        kept = kept_lines(args)
    except (OSError, ValueError) as exc:
        print(f"sim trace conversations: error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(kept), encoding="utf-8")
    convs = len({conversation_key(line, args.key_blocks) for line in kept})
    print(f"wrote {len(kept)} requests of {convs} conversations of {args.trace} to {args.out}")
    return 0
