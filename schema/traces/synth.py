"""Synthetic traces: arrival processes and length distributions, written as Mooncake JSONL.

Arrivals: ``poisson`` (exponential gaps, rate R) or ``gamma`` (gamma gaps with mean
1/R and coefficient of variation CV; CV=1 is Poisson, CV>1 is burstier).
Lengths: ``fixed:N``, ``uniform:A:B`` (integers, both ends included) or
``empirical:TRACE`` (drawn with replacement from the same field of a real trace).

Shared prefixes (``prefix_groups`` G > 0): each request draws one of G groups
uniformly; group g has a prefix of ``prefix_len`` tokens (drawn once per group).
A request's prompt blocks (512 tokens, Mooncake's ``hash_ids``) start with as
many of its group's full prefix blocks as fit in its prompt; every other block
has an id of its own. A group is reused every G requests on average, so G sets
the reuse distance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schema.traces.load import load_trace
from schema.traces.record import HASH_BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class LengthSpec:
    """A parsed length distribution."""

    kind: str  # fixed | uniform | empirical
    low: int = 0
    high: int = 0
    trace: str = ""

    @staticmethod
    def parse(text: str) -> LengthSpec:
        kind, _, rest = text.partition(":")
        parts = rest.split(":") if rest else []
        try:
            if kind == "fixed" and len(parts) == 1:
                n = int(parts[0])
                spec = LengthSpec("fixed", n, n)
            elif kind == "uniform" and len(parts) == 2:
                spec = LengthSpec("uniform", int(parts[0]), int(parts[1]))
            elif kind == "empirical" and rest:
                return LengthSpec("empirical", trace=rest)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"bad length spec {text!r}: use fixed:N, uniform:A:B or empirical:TRACE"
            ) from None
        if spec.low < 0 or spec.high < spec.low:
            raise ValueError(f"bad length spec {text!r}: need 0 <= A <= B")
        return spec

    def sample(self, rng: np.random.Generator, n: int, field: str) -> np.ndarray:
        """``n`` lengths; ``field`` is ``input`` or ``output`` (which column of a trace)."""
        if self.kind == "fixed":
            return np.full(n, self.low, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)
        trace = load_trace(self.trace)
        pool = np.array(
            [r.input_length if field == "input" else r.output_length for r in trace.requests],
            dtype=np.int64,
        )
        return rng.choice(pool, size=n, replace=True)


def arrival_times(
    rng: np.random.Generator, arrival: str, rate: float, num: int, cv: float = 1.0
) -> np.ndarray:
    """Arrival times in seconds; the first request arrives at 0."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if num < 1:
        raise ValueError(f"num must be >= 1, got {num}")
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / rate, size=num - 1)
    elif arrival == "gamma":
        if not cv > 0:
            raise ValueError(f"cv must be > 0, got {cv}")
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=num - 1)
    else:
        raise ValueError(f"unknown arrival process {arrival!r} (poisson or gamma)")
    return np.concatenate([[0.0], np.cumsum(gaps)])


def prefix_blocks(
    rng: np.random.Generator, inputs: np.ndarray, groups: int, prefix_len: str
) -> list[list[int]]:
    """``hash_ids`` of each prompt: its group's shared prefix blocks, then blocks of its own."""
    if groups < 1:
        raise ValueError(f"prefix groups must be >= 1, got {groups}")
    shared = LengthSpec.parse(prefix_len).sample(rng, groups, "input") // HASH_BLOCK_TOKENS
    starts = np.concatenate([[0], np.cumsum(shared)])
    fresh = int(starts[-1])
    group_of = rng.integers(groups, size=len(inputs))
    ids: list[list[int]] = []
    for length, g in zip(inputs.tolist(), group_of.tolist(), strict=True):
        blocks = -(-length // HASH_BLOCK_TOKENS)
        common = min(int(shared[g]), length // HASH_BLOCK_TOKENS)
        own = blocks - common
        ids.append([*range(int(starts[g]), int(starts[g]) + common), *range(fresh, fresh + own)])
        fresh += own
    return ids


def generate(
    out: Path,
    *,
    arrival: str,
    rate: float,
    input_spec: str,
    output_spec: str,
    num: int,
    seed: int,
    cv: float = 1.0,
    prefix_groups: int = 0,
    prefix_len: str = "fixed:0",
) -> int:
    """Write ``num`` synthetic requests to ``out`` (JSONL); return the count written.

    With ``prefix_groups`` > 0 every request carries ``hash_ids`` (``prefix_blocks``)."""
    rng = np.random.default_rng(seed)
    times = arrival_times(rng, arrival, rate, num, cv)
    inputs = LengthSpec.parse(input_spec).sample(rng, num, "input")
    outputs = LengthSpec.parse(output_spec).sample(rng, num, "output")
    hash_ids = prefix_blocks(rng, inputs, prefix_groups, prefix_len) if prefix_groups else None
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for i in range(num):
            row = {
                "rid": f"syn-{i}",
                "timestamp": round(float(times[i]) * 1e3, 3),
                "input_length": int(inputs[i]),
                "output_length": int(outputs[i]),
            }
            if hash_ids is not None:
                row["hash_ids"] = hash_ids[i]
            f.write(json.dumps(row) + "\n")
    return num
