"""A plan laid out as the host-side arrays of one forward pass (numpy, no device work).

Row layout of a step (every per-token array follows it)::

    | chunk 0 tokens | ... | verify 0 tokens | ... | decode 0 | decode 1 | ... |
      plan.prefill          decode slots with a     decode slots without one,
                            draft, 1 + len(draft)   one row each (plan order)
                            rows each (plan order)

Sequence ``i`` owns rows ``qo_indptr[i]:qo_indptr[i+1]``, attends to
``kv_lens[i]`` positions (cached plus new) held in its first ``page_counts[i]``
pages, and writes the K/V of its new rows at their positions. The first
``num_prefill`` sequences (prefill chunks, then verify spans) attend causally
over their context as an extend does; the rest are one-row decodes (the shape
CUDA graphs capture). A verify span feeds the slot's token at ``position`` and
its draft at the positions after it, and every one of its rows is sampled.

``sample_rows`` are the rows whose logits are sampled, in the order of
``plan.sampling_rids()``, a request's rows together (``drafts`` says how many:
one plus its draft's length). An input id of ``FROM_LAST_SAMPLE`` stands for
the token that the previous step sampled for that request (overlap scheduling:
the step is launched before that token reaches the host); only the first row
of a decode slot may hold it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from core.scheduler.plan import Plan
from engine.runner.inputs import FROM_LAST_SAMPLE, StepInputs
from engine.sampling.verify import row_counts


@dataclass(frozen=True, slots=True)
class StepLayout:
    rids: list[str]
    pages: list[tuple[int, ...]]
    input_ids: np.ndarray  # int64 [T]
    positions: np.ndarray  # int64 [T]
    qo_indptr: np.ndarray  # int32 [N + 1]
    kv_lens: np.ndarray  # int32 [N]
    page_counts: np.ndarray  # int32 [N]
    sample_rows: np.ndarray  # int64 [S]
    drafts: list[tuple[int, ...]]  # per sampling request (plan.sampling_rids()), () for none
    num_prefill: int  # sequences attended as extends: prefill chunks and verify spans
    page_size: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.rids)

    @property
    def is_decode(self) -> bool:
        """Every sequence decodes one token (the shape CUDA graphs capture): no prefill chunk,
        no draft to verify."""
        return self.num_prefill == 0

    @property
    def kv_indptr(self) -> np.ndarray:
        out = np.zeros(self.num_seqs + 1, dtype=np.int32)
        np.cumsum(self.page_counts, out=out[1:])
        return out

    @property
    def last_page_len(self) -> np.ndarray:
        """Tokens in each sequence's last page, in ``[1, page_size]``."""
        return (self.kv_lens - 1) % self.page_size + 1

    def single_rows(self, sampling_rids: list[str]) -> dict[str, int]:
        """Request -> its row of the step's samples, for the requests that sampled one token
        (``sampling_rids``: the plan's); a slot with a draft keeps a varying number of its
        rows' tokens, so the next step cannot read its last."""
        out: dict[str, int] = {}
        row = 0
        for rid, n in zip(sampling_rids, row_counts(self.drafts), strict=True):
            if n == 1:
                out[rid] = row
            row += n
        return out

    @staticmethod
    def build(plan: Plan, inputs: StepInputs, page_size: int, vocab_size: int) -> StepLayout:
        """Validate the plan against its token ids, then lay it out."""
        _check_counts(plan, inputs)
        rids: list[str] = []
        pages: list[tuple[int, ...]] = []
        starts: list[int] = []
        lengths: list[int] = []
        for chunk, tokens in zip(plan.prefill, inputs.prefill_tokens, strict=True):
            if len(tokens) != chunk.length or chunk.length < 1:
                raise ValueError(
                    f"request {chunk.rid}: prefill chunk of length {chunk.length} "
                    f"got {len(tokens)} token ids"
                )
            rids.append(chunk.rid)
            pages.append(chunk.pages)
            starts.append(chunk.start)
            lengths.append(chunk.length)
        slots = sorted(range(len(plan.decode)), key=lambda j: not plan.decode[j].draft)
        for j in slots:
            slot = plan.decode[j]
            rids.append(slot.rid)
            pages.append(slot.pages)
            starts.append(slot.position)
            lengths.append(1 + len(slot.draft))
        start = np.asarray(starts, dtype=np.int64)
        length = np.asarray(lengths, dtype=np.int64)
        kv_lens = (start + length).astype(np.int32)
        page_counts = -(-kv_lens // page_size)
        _check_pages(rids, pages, start, kv_lens, page_counts)
        qo_indptr = np.zeros(len(rids) + 1, dtype=np.int32)
        np.cumsum(length, out=qo_indptr[1:])
        num_verify = sum(1 for d in plan.decode if d.draft)
        return StepLayout(
            rids=rids,
            pages=pages,
            input_ids=_input_ids(plan, inputs, slots, vocab_size),
            positions=_positions(start, length, int(qo_indptr[-1])),
            qo_indptr=qo_indptr,
            kv_lens=kv_lens,
            page_counts=page_counts.astype(np.int32),
            sample_rows=_sample_rows(plan, slots, qo_indptr),
            drafts=[()] * sum(c.samples for c in plan.prefill) + [d.draft for d in plan.decode],
            num_prefill=len(plan.prefill) + num_verify,
            page_size=page_size,
        )


def _check_counts(plan: Plan, inputs: StepInputs) -> None:
    scored = inputs.prompt_logprobs
    if scored and len(scored) != len(plan.prefill):
        raise ValueError(
            f"plan has {len(plan.prefill)} prefill chunks but {len(scored)} prompt log-prob "
            "entries were given"
        )
    for chunk, req in zip(plan.prefill, scored, strict=False):
        if req is not None and len(req.targets) > chunk.length:
            raise ValueError(
                f"request {chunk.rid}: {len(req.targets)} prompt log-prob targets for a chunk "
                f"of {chunk.length} tokens"
            )
    if len(inputs.prefill_tokens) != len(plan.prefill):
        raise ValueError(
            f"plan has {len(plan.prefill)} prefill chunks but {len(inputs.prefill_tokens)} "
            "token lists were given"
        )
    if len(inputs.decode_tokens) != len(plan.decode):
        raise ValueError(
            f"plan has {len(plan.decode)} decode slots but {len(inputs.decode_tokens)} "
            "decode tokens were given"
        )


def _check_pages(
    rids: Sequence[str],
    pages: Sequence[tuple[int, ...]],
    start: np.ndarray,
    kv_lens: np.ndarray,
    page_counts: np.ndarray,
) -> None:
    for i, rid in enumerate(rids):
        if start[i] < 0:
            raise ValueError(f"request {rid}: negative position {int(start[i])}")
        if len(pages[i]) < page_counts[i]:
            raise ValueError(
                f"request {rid}: {int(kv_lens[i])} tokens need {int(page_counts[i])} pages, "
                f"the page table has {len(pages[i])}"
            )


def _sample_rows(plan: Plan, slots: list[int], qo_indptr: np.ndarray) -> np.ndarray:
    """The sampled rows in the order of ``plan.sampling_rids()``: each prefill chunk's last row
    if it samples, then every row of each decode slot, in plan order (``slots``: the slots in
    layout order)."""
    rows = [int(qo_indptr[i + 1]) - 1 for i, c in enumerate(plan.prefill) if c.samples]
    first = len(plan.prefill)
    seq_of = {j: first + n for n, j in enumerate(slots)}
    for j, slot in enumerate(plan.decode):
        row = int(qo_indptr[seq_of[j]])
        rows.extend(range(row, row + 1 + len(slot.draft)))
    return np.asarray(rows, dtype=np.int64)


def _input_ids(plan: Plan, inputs: StepInputs, slots: list[int], vocab_size: int) -> np.ndarray:
    """Prefill ids, then each decode slot's id and draft (``slots``: layout order); only a
    decode slot's own id may be ``FROM_LAST_SAMPLE``."""
    total = sum(c.length for c in plan.prefill)
    prefill = np.fromiter(chain.from_iterable(inputs.prefill_tokens), np.int64, count=total)
    decode = [[inputs.decode_tokens[j], *plan.decode[j].draft] for j in slots]
    ids = np.concatenate((prefill, np.fromiter(chain.from_iterable(decode), np.int64)))
    drafted = np.fromiter(chain.from_iterable(d.draft for d in plan.decode), np.int64)
    own = np.asarray(inputs.decode_tokens, dtype=np.int64)
    known = np.concatenate((prefill, drafted, own[own != FROM_LAST_SAMPLE]))
    if len(known) and (int(known.min()) < 0 or int(known.max()) >= vocab_size):
        raise ValueError(
            f"token ids must be in [0, {vocab_size}), got values in "
            f"[{int(known.min())}, {int(known.max())}]"
        )
    return ids


def _positions(start: np.ndarray, length: np.ndarray, total: int) -> np.ndarray:
    """``start[i] .. start[i] + length[i] - 1`` for each sequence, concatenated."""
    offsets = np.repeat(np.cumsum(length) - length, length)
    positions: np.ndarray = np.repeat(start, length) + np.arange(total, dtype=np.int64) - offsets
    return positions
