"""Keep the requests of a random share of a Mooncake trace's conversations, lines unchanged.

    python3 scripts/trace_conversations.py traces/mooncake_conversation.jsonl \\
        --fraction 0.02 --seed 1 --out build/mooncake_conv2pct.jsonl

A conversation is the requests whose first ``--key-blocks`` prefix hash ids agree
(in the Mooncake conversation trace every prompt starts with the same block, and the
second names the conversation). Sampling whole conversations keeps their turns, so
the prefix reuse of a multi-turn conversation survives while the trace gets shorter:
a time window of the same length would keep the reuse distance (a median of ~380
requests between a block's uses in this trace) and lose most hits. Conversations of
one request are dropped unless ``--keep-single``. ``--max-input N`` keeps only the
conversations whose every prompt fits in N tokens (a small model's context, or a
CPU replica's time), before the share is drawn. The reader takes arrivals relative
to the first kept request; replay it at a ``--rate-scale`` to set the load.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("trace", type=Path, help="a Mooncake-format .jsonl trace")
    ap.add_argument("--fraction", type=float, required=True, help="share of conversations kept")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--key-blocks", type=int, default=2, help="hash ids that name a conversation")
    ap.add_argument("--keep-single", action="store_true", help="also one-request conversations")
    ap.add_argument("--max-input", type=int, help="only conversations whose prompts all fit")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.trace.suffix != ".jsonl":
        ap.error(f"{args.trace}: conversations need prefix hash ids, a .jsonl trace")
    if not 0 < args.fraction <= 1 or args.key_blocks < 1:
        ap.error("need 0 < --fraction <= 1 and --key-blocks >= 1")
    if args.max_input is not None and args.max_input < 1:
        ap.error("need --max-input >= 1")
    with args.trace.open(encoding="utf-8") as f:
        lines = [line if line.endswith("\n") else line + "\n" for line in f if line.strip()]
    kept = sample(lines, args.fraction, args.seed, args.key_blocks, args.keep_single,
                  args.max_input)  # fmt: skip
    if not kept:
        ap.error("no conversation kept: raise --fraction")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(kept), encoding="utf-8")
    convs = len({conversation_key(line, args.key_blocks) for line in kept})
    print(f"wrote {len(kept)} requests of {convs} conversations of {args.trace} to {args.out}")


if __name__ == "__main__":
    main()
