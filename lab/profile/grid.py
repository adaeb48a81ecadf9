"""The grid of batch plans that ``engine profile`` times, and the plans themselves.

A ``StepPoint`` is one batch: prefill chunks ``(start, length)`` (``start`` > 0
means a cached prefix the chunk attends to) and decode slots (the position of
each request's new token). Every sequence gets its own pages, so a step reads
as much KV as it would in serving. Points whose pages do not fit in the pool,
or with a sequence longer than a request may be, are left out (and reported).

The grid crosses prefill sizes with cached prefixes and chunk counts, decode
batch sizes with per-request contexts, and a few prefill sizes with decode
batches (mixed steps: the chunk after each of ``mixed_prefixes``, the decodes at
each of ``mixed_contexts``). Decode and mixed steps come uniform (every request at
one context) and ragged (one request at a long context, each of
``ragged_longest``, by default the longest decode context, the others at the
shortest), so that a fit can tell the context read from the context padded to
the longest request (on FlashInfer a row past 8,192 tokens among short ones is
planned apart, or cut into pieces and run eagerly: a ``ragged_longest`` on each
side of that length measures both). Verify steps (speculative decoding) cross
``verify_drafts`` with the decode batches and contexts: every decode slot
carries that many draft tokens, which the runner lays out as an extend of
``1 + draft`` tokens at its context (none by default); the mixed points, too,
come once more per ``verify_drafts`` with drafted slots (a newcomer's chunk
prefilled beside verify spans, a step no CUDA graph replays). Held-out points are
drawn at random inside the same ranges, each request its own context (seeded);
the ``table`` fit never sees them, so its error on them is an honest estimate of
its error between grid points.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from core.scheduler.pages import pages_for
from core.scheduler.plan import DecodeSlot, Plan, PrefillChunk

DRAFT_TOKEN = 0
"""The token id of every draft token of a verify plan (its values do not change the work)."""


@dataclass(frozen=True, slots=True)
class StepPoint:
    prefill: tuple[tuple[int, int], ...]  # (start, length) per chunk
    decode: tuple[int, ...]  # position of each decode slot's new token
    split: str = "fit"
    draft: int = 0  # draft tokens of every decode slot (a verify step)

    def sequence_pages(self, page_size: int) -> list[int]:
        """The pages each sequence of the point holds (prefill chunks, then decode slots)."""
        ends = [s + n for s, n in self.prefill] + [p + 1 + self.draft for p in self.decode]
        return [pages_for(e, page_size) for e in ends]

    def plan(self, page_size: int, pages: Sequence[int] | None = None) -> Plan:
        """The plan of this point: rids ``p0..``/``d0..``, pages laid out one sequence after
        another from page 0, or taken in the order of ``pages`` (a serving pool's pages are
        scattered: ``engine profile --scatter-pages``)."""
        next_page = 0

        def take(tokens: int) -> tuple[int, ...]:
            nonlocal next_page
            n = pages_for(tokens, page_size)
            next_page += n
            taken = range(next_page - n, next_page)
            return tuple(taken) if pages is None else tuple(pages[i] for i in taken)

        prefill = tuple(
            PrefillChunk(f"p{i}", s, n, True, take(s + n)) for i, (s, n) in enumerate(self.prefill)
        )
        draft = (DRAFT_TOKEN,) * self.draft
        decode = tuple(
            DecodeSlot(f"d{i}", p, take(p + 1 + self.draft), draft)
            for i, p in enumerate(self.decode)
        )
        return Plan(step=0, prefill=prefill, decode=decode)


def ints(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``; every value a positive integer (``0`` allowed for prefixes)."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise ValueError(f"expected comma-separated integers >= 0, got {text!r}")
    return values


def cuda_batches(largest: int = 256) -> tuple[int, ...]:
    """1..8, then every multiple of 8 and the size after it: both sides of any
    CUDA-graph bucket edge on a multiple of 8."""
    sizes = set(range(1, 9))
    for b in range(8, largest + 1, 8):
        sizes.update((b, b + 1))
    return tuple(sorted(s for s in sizes if s <= largest))


@dataclass(frozen=True, slots=True)
class GridSpec:
    prefill_tokens: tuple[int, ...]
    prefill_prefixes: tuple[int, ...]
    prefill_chunks: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    mixed_prefill: tuple[int, ...]
    mixed_batches: tuple[int, ...]
    holdout: int
    mixed_prefixes: tuple[int, ...] = (0,)
    mixed_contexts: tuple[int, ...] = ()  # none given: the middle one of ``decode_contexts``
    ragged_longest: tuple[int, ...] = ()  # none given: the longest of ``decode_contexts``
    seed: int = 0
    verify_drafts: tuple[int, ...] = ()  # draft tokens per slot of verify steps; none: none

    def __post_init__(self) -> None:
        if any(k < 1 for k in self.verify_drafts):
            raise ValueError(f"verify drafts must be >= 1, got {self.verify_drafts}")
        if not self.mixed_contexts:
            middle = sorted(self.decode_contexts)[len(self.decode_contexts) // 2]
            object.__setattr__(self, "mixed_contexts", (middle,))
        if not self.ragged_longest:
            object.__setattr__(self, "ragged_longest", (max(self.decode_contexts),))

    @staticmethod
    def default(device: str) -> GridSpec:
        if device.startswith("cuda"):
            return GridSpec(
                prefill_tokens=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
                prefill_prefixes=(0, 4096),
                prefill_chunks=(1, 4),
                decode_batches=cuda_batches(256),
                decode_contexts=(256, 1024, 4096),
                mixed_prefill=(256, 2048),
                mixed_batches=(8, 64),
                holdout=40,
            )
        return GridSpec(  # prefill sizes off the powers of two, as prompts are (oneDNN's
            # bf16 kernels run aligned sizes 6-14 % faster a token)
            prefill_tokens=(20, 60, 124, 252, 508, 1020, 2044),
            prefill_prefixes=(0, 1024),
            prefill_chunks=(1, 4),
            decode_batches=(1, 2, 4, 8, 16, 32, 64),
            decode_contexts=(128, 512, 2048),
            mixed_prefill=(128, 512),
            mixed_batches=(4, 16),
            holdout=12,
        )

    def points(self) -> list[StepPoint]:
        """The fit points, then ``holdout`` held-out ones."""
        out: list[StepPoint] = []
        for tokens in self.prefill_tokens:
            for chunks in self.prefill_chunks:
                if tokens % chunks == 0 and tokens // chunks >= 1:
                    for prefix in self.prefill_prefixes:
                        out.append(StepPoint(((prefix, tokens // chunks),) * chunks, ()))
        for batch in self.decode_batches:
            for context in self.decode_contexts:
                out.append(StepPoint((), (context,) * batch))
            out += [StepPoint((), ragged) for ragged in self.ragged(batch)]
        for draft in self.verify_drafts:
            for batch in self.decode_batches:
                for context in self.decode_contexts:
                    out.append(StepPoint((), (context,) * batch, draft=draft))
        for prefix in self.mixed_prefixes:
            for tokens in self.mixed_prefill:
                for batch in self.mixed_batches:
                    for context in self.mixed_contexts:
                        out.append(StepPoint(((prefix, tokens),), (context,) * batch))
                        out += [
                            StepPoint(((prefix, tokens),), (context,) * batch, draft=draft)
                            for draft in self.verify_drafts
                        ]
                    out += [StepPoint(((prefix, tokens),), r) for r in self.ragged(batch)]
        return list(dict.fromkeys(out)) + self.holdout_points()

    def ragged(self, batch: int) -> list[tuple[int, ...]]:
        """One request at each of ``ragged_longest``, the others at the shortest context: what
        padding the decode batch to its longest request costs."""
        shortest = min(self.decode_contexts)
        return [(longest,) + (shortest,) * (batch - 1) for longest in self.ragged_longest]

    def holdout_points(self) -> list[StepPoint]:
        """Random points inside the grid's ranges: a third each decode, prefill, mixed (a
        quarter each and verify, with ``verify_drafts``, every other mixed one drafted)."""
        rng = random.Random(self.seed)
        out: list[StepPoint] = []

        def between(values: tuple[int, ...]) -> int:
            return rng.randint(min(values), max(values))

        def contexts(batches: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(between(self.decode_contexts) for _ in range(between(batches)))

        kinds = 4 if self.verify_drafts else 3
        for i in range(self.holdout):
            kind = i % kinds
            if kind == 3:
                draft = rng.choice(self.verify_drafts)
                out.append(StepPoint((), contexts(self.decode_batches), "holdout", draft))
            elif kind == 0:
                out.append(StepPoint((), contexts(self.decode_batches), "holdout"))
            elif kind == 1:
                chunks = rng.choice(self.prefill_chunks)
                length = max(1, between(self.prefill_tokens) // chunks)
                prefix = between(self.prefill_prefixes)
                out.append(StepPoint(((prefix, length),) * chunks, (), "holdout"))
            else:
                # one mixed prefix draws nothing (such grids keep their held-out points)
                prefix = (
                    between(self.mixed_prefixes)
                    if len(self.mixed_prefixes) > 1
                    else self.mixed_prefixes[0]
                )
                prefill = ((prefix, between(self.mixed_prefill)),)
                turn = i // kinds  # no draw: a grid without verify drafts keeps its points
                drafts = self.verify_drafts
                draft = drafts[turn // 2 % len(drafts)] if drafts and turn % 2 else 0
                out.append(StepPoint(prefill, contexts(self.mixed_batches), "holdout", draft))
        return out
