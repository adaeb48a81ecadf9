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
import sys
from pathlib import Path

from lab.tools import add_tool
from schema.traces.conversations import conversation_key, read_lines, sample
from schema.traces.record import TraceError
from schema.traces.window import from_zero

HELP = "keep a random share of a Mooncake trace's conversations, every turn of each"
EXAMPLE = """example:
  sim trace conversations traces/mooncake_conversation.jsonl --fraction 0.02 --seed 1 \\
      --out build/mooncake_conv2pct.jsonl"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sim trace conversations``: its flags and its handler."""
    p = add_tool(sub, "conversations", help=HELP, doc=__doc__, example=EXAMPLE)
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
