"""A plan turned into the tensors one forward pass needs, shared by the model and attention.

Row layout of a step (every per-token tensor follows it)::

    | chunk 0 tokens | chunk 1 tokens | ... | decode 0 | decode 1 | ... |
      plan.prefill, in order                  plan.decode, one row each

``sample_rows`` picks the rows whose logits are sampled, in the order of
``plan.sampling_rids()``: the last row of every sampling chunk, then every
decode row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.scheduler.plan import Plan


@dataclass(frozen=True, slots=True)
class SeqSpan:
    """One sequence's new tokens: rows ``[row, row + length)`` at positions from ``start``."""

    row: int
    start: int
    length: int
    pages: tuple[int, ...]

    @property
    def context_len(self) -> int:
        """Tokens this sequence attends to (cached plus new)."""
        return self.start + self.length


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slots: torch.Tensor  # [T] int64: flat KV slot where each row's K/V is written
    sample_rows: torch.Tensor  # [N] int64
    prefill: tuple[SeqSpan, ...]
    decode: tuple[SeqSpan, ...]
    page_size: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.length for s in self.prefill)

    @staticmethod
    def build(
        plan: Plan,
        prefill_tokens: Sequence[Sequence[int]],
        decode_tokens: Sequence[int],
        page_size: int,
        num_pages: int,
        device: torch.device,
    ) -> ForwardBatch:
        """Validate the plan against its token ids and the pool size, then lay it out."""
        if len(prefill_tokens) != len(plan.prefill):
            raise ValueError(
                f"plan has {len(plan.prefill)} prefill chunks but {len(prefill_tokens)} "
                "token lists were given"
            )
        if len(decode_tokens) != len(plan.decode):
            raise ValueError(
                f"plan has {len(plan.decode)} decode slots but {len(decode_tokens)} "
                "decode tokens were given"
            )
        ids: list[int] = []
        prefill: list[SeqSpan] = []
        sample_rows: list[int] = []
        positions: list[torch.Tensor] = []
        slots: list[torch.Tensor] = []
        for chunk, tokens in zip(plan.prefill, prefill_tokens, strict=True):
            if len(tokens) != chunk.length or chunk.length < 1:
                raise ValueError(
                    f"request {chunk.rid}: prefill chunk of length {chunk.length} "
                    f"got {len(tokens)} token ids"
                )
            span = SeqSpan(len(ids), chunk.start, chunk.length, chunk.pages)
            _check_pages(chunk.rid, span, page_size, num_pages)
            pos = torch.arange(chunk.start, span.context_len, dtype=torch.int64)
            table = torch.tensor(chunk.pages, dtype=torch.int64)
            positions.append(pos)
            slots.append(table[pos // page_size] * page_size + pos % page_size)
            ids.extend(tokens)
            prefill.append(span)
            if chunk.samples:
                sample_rows.append(len(ids) - 1)
        decode: list[SeqSpan] = []
        for slot in plan.decode:
            span = SeqSpan(len(ids) + len(decode), slot.position, 1, slot.pages)
            _check_pages(slot.rid, span, page_size, num_pages)
            decode.append(span)
        if decode:
            sample_rows.extend(s.row for s in decode)
            pos = torch.tensor([s.start for s in decode], dtype=torch.int64)
            last_pages = torch.tensor(
                [s.pages[s.start // page_size] for s in decode], dtype=torch.int64
            )
            positions.append(pos)
            slots.append(last_pages * page_size + pos % page_size)
            ids.extend(decode_tokens)
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64).to(device),
            positions=torch.cat(positions).to(device),
            slots=torch.cat(slots).to(device),
            sample_rows=torch.tensor(sample_rows, dtype=torch.int64).to(device),
            prefill=tuple(prefill),
            decode=tuple(decode),
            page_size=page_size,
        )


def _check_pages(rid: str, span: SeqSpan, page_size: int, num_pages: int) -> None:
    needed = -(-span.context_len // page_size)
    if len(span.pages) < needed:
        raise ValueError(
            f"request {rid}: {span.context_len} tokens need {needed} pages, "
            f"the page table has {len(span.pages)}"
        )
    if span.start < 0:
        raise ValueError(f"request {rid}: negative position {span.start}")
    bad = [p for p in span.pages[:needed] if not 0 <= p < num_pages]
    if bad:
        raise ValueError(f"request {rid}: page ids {bad} outside the pool of {num_pages} pages")
