"""Whole conversations of a Mooncake trace: the requests that share their first prefix hash
ids, every turn of each (``sim trace conversations``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from schema.traces.record import TraceError


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
