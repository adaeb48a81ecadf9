"""Weighted samples too many to hold: appended chunk by chunk to a temporary file.

The pooled inter-token gaps of a week's replay are some 10^8 (value, count)
pairs. ``SpilledSamples`` keeps them on disk and answers the summary's
questions exactly, in passes over the file:

- a value at a rank of the sorted, expanded samples by radix selection: each
  float maps to an unsigned key in the same order; a pass counts the samples
  under each value of the key's next 16 bits, which narrows the rank to one
  such bucket; once a bucket holds few enough pairs, a last pass collects and
  sorts them. At most five passes, and memory for ``COLLECT_PAIRS`` pairs.
- percentiles from those ranks as ``np.percentile`` (``schema.samples.interpolate``),
  so they equal ``WeightedSamples``' bit for bit;
- the mean of value x count as ``ExactSum`` takes it (correctly rounded).

Non-finite values are dropped as they come (the statistics are of the finite
samples, as ``WeightedSamples.finite``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import IO

import numpy as np

from schema.exactsum import ExactSum
from schema.samples import WeightedSamples, interpolate

PAIR = np.dtype([("value", np.float64), ("count", np.int64)])
READ_PAIRS = 1 << 22
"""Pairs read from the file at a time."""
COLLECT_PAIRS = 1 << 22
"""A bucket of at most this many pairs is collected and sorted in memory."""
_BUCKET_BITS = 16
_SIGN = np.uint64(1 << 63)


def sort_keys(values: np.ndarray) -> np.ndarray:
    """Unsigned keys in the order of the (finite) values."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


class SpilledSamples:
    """``add`` chunks of (values, counts); then ``size``, ``mean``, ``percentile``, ``load``."""

    def __init__(self) -> None:
        self._file: IO[bytes] = tempfile.TemporaryFile(prefix="samples-")  # noqa: SIM115
        self._products = ExactSum()  # of value * count
        self.size = 0  # samples, counting repeats
        self.pairs = 0
        self.scale = 1.0

    def add(self, values: np.ndarray, counts: np.ndarray) -> None:
        keep = np.isfinite(values)
        chunk = np.empty(int(keep.sum()), dtype=PAIR)
        chunk["value"] = values[keep]
        chunk["count"] = counts[keep]
        chunk.tofile(self._file)
        self._products.add(chunk["value"] * chunk["count"])
        self.size += int(chunk["count"].sum())
        self.pairs += len(chunk)

    def _chunks(self) -> Iterator[np.ndarray]:
        self._file.flush()
        self._file.seek(0)
        left = self.pairs
        while left:
            chunk = np.fromfile(self._file, dtype=PAIR, count=min(left, READ_PAIRS))
            left -= len(chunk)
            yield chunk

    def scaled(self, factor: float) -> SpilledSamples:
        """The same samples, each read as ``value * factor`` (the file is shared)."""
        out = SpilledSamples.__new__(SpilledSamples)
        out._file, out._products = self._file, self._products
        out.size, out.pairs, out.scale = self.size, self.pairs, self.scale * factor
        return out

    def finite(self) -> SpilledSamples:
        return self

    def mean(self) -> float:
        return self._products.sum() / self.size * self.scale

    def percentile(self, q: list[float] | tuple[float, ...] | np.ndarray) -> np.ndarray:
        return interpolate(self.size, q, self.at_ranks)

    def load(self) -> WeightedSamples:
        """All samples in memory, sorted."""
        pairs = np.concatenate([np.zeros(0, dtype=PAIR), *self._chunks()])
        samples = (
            WeightedSamples(pairs["value"] * self.scale, pairs["count"])
            if pairs.size
            else (WeightedSamples.of([]))
        )
        return samples.sorted()

    def at_ranks(self, ranks: np.ndarray) -> np.ndarray:
        """The values at 0-based ``ranks`` of the sorted, expanded samples."""
        unique, back = np.unique(ranks, return_inverse=True)
        found = {int(r): v for r, v in zip(unique, self._select(unique.tolist()), strict=True)}
        return np.asarray([found[int(r)] for r in unique[back]], dtype=np.float64) * self.scale

    def _select(self, ranks: list[int]) -> list[float]:
        """The values at ``ranks``: each rank's key range (a prefix of the key's bits, and
        how many bits below it are free) narrows pass by pass, with the samples below it."""
        where = {i: (0, 64) for i in range(len(ranks))}  # rank -> (prefix, free bits)
        below = [0] * len(ranks)  # samples with keys under smaller prefixes
        pairs = {(0, 64): self.pairs}  # pairs under each range in play
        found: dict[int, float] = {}
        while where:
            ranges = set(where.values())
            split = {r for r in ranges if pairs[r] > COLLECT_PAIRS}
            counted = self._pass(ranges, split)
            for i, (prefix, free) in list(where.items()):
                weights, entries = counted[(prefix, free)]
                at = int(np.searchsorted(np.cumsum(weights), ranks[i] - below[i], side="right"))
                if (prefix, free) not in split:  # sorted values and their counts
                    found[i] = float(entries[at])
                    del where[i]
                    continue
                below[i] += int(weights[:at].sum())
                key = ((prefix << _BUCKET_BITS) | at, free - _BUCKET_BITS)
                pairs[key] = int(entries[at])
                if key[1] == 0:  # one key: one value
                    found[i] = float(_value_of(key[0]))
                    del where[i]
                else:
                    where[i] = key
        return [found[i] for i in range(len(ranks))]

    def _pass(
        self, ranges: set[tuple[int, int]], split: set[tuple[int, int]]
    ) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
        """One pass: per range (key prefix, free bits) to split, the samples and the pairs
        under each value of the next 16 bits; per range to collect, the counts and the values
        of its pairs sorted by value."""
        size = 1 << _BUCKET_BITS
        out: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {
            r: (np.zeros(size), np.zeros(size)) for r in split
        }
        collected: dict[tuple[int, int], list[np.ndarray]] = {r: [] for r in ranges - split}
        for chunk in self._chunks():
            keys = sort_keys(chunk["value"])
            for p, free in ranges:
                mine = (keys >> np.uint64(free)) == np.uint64(p) if free < 64 else slice(None)
                if (p, free) in collected:
                    collected[(p, free)].append(chunk[mine])
                    continue
                sub = (keys[mine] >> np.uint64(free - _BUCKET_BITS)) & np.uint64(size - 1)
                sub = sub.astype(np.int64)
                weights, entries = out[(p, free)]
                weights += np.bincount(sub, weights=chunk["count"][mine], minlength=size)
                entries += np.bincount(sub, minlength=size)
        for r, parts in collected.items():
            pairs = np.concatenate([np.zeros(0, dtype=PAIR), *parts])
            s = WeightedSamples(pairs["value"], pairs["count"]).sorted()
            out[r] = (s.counts.astype(np.float64), s.values)
        return out


def _value_of(key: int) -> np.float64:
    k = np.uint64(key)
    bits = k ^ _SIGN if k & _SIGN else ~k
    value: np.float64 = np.array([bits], dtype=np.uint64).view(np.float64)[0]
    return value
