"""A laid-out step moved to the device: one upload, then the attention metadata.

``upload`` sends every per-step array in one pinned copy (``Staging``): the
step's token ids and positions, where decode inputs come from the previous
step's samples, the request slots, the page-table writes and the sampling
parameters. ``metadata`` applies the page-table writes; a step's KV indices
and write slots then come either with the upload, laid out on the host from
the plan's page tuples (a step of at most ``HOST_PAGES`` pages: a few numpy
calls, where the device's gather costs a dozen kernel launches of host time), or
are gathered from the request table on the device (larger steps, whose page
lists would cost more host time to lay out and copy than the launches).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from engine.attention.metadata import AttentionMetadata, host_tensor
from engine.runner.layout import StepLayout
from engine.runner.staging import Staging
from engine.runner.table import RequestTable
from engine.sampling.sampler import SamplingArrays

HOST_PAGES = 4096  # steps of at most this many pages lay out their KV indices on the host


@dataclass(frozen=True, slots=True)
class DeviceStep:
    input_ids: torch.Tensor  # int64 [T]; FROM_LAST_SAMPLE where ``source`` >= 0
    source: torch.Tensor  # int64 [T]: row of the previous step's samples, or -1
    positions: torch.Tensor  # int64 [T]
    slots: torch.Tensor  # int32 [N]
    page_counts: torch.Tensor  # int32 [N]
    kv_indptr: torch.Tensor  # int32 [N + 1]
    token_slots: torch.Tensor  # int32 [T]
    sample_rows: torch.Tensor  # int64 [S]
    writes: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # rows, cols, page ids
    sampling: SamplingArrays
    sourced: int  # rows whose input id comes from the previous step's samples
    laid_out: tuple[torch.Tensor, torch.Tensor] | None  # (kv_indices, out_slots) from the host

    @staticmethod
    def upload(
        layout: StepLayout,
        source: np.ndarray,
        slots: np.ndarray,
        writes: tuple[np.ndarray, np.ndarray, np.ndarray],
        sampling: SamplingArrays,
        staging: Staging,
    ) -> DeviceStep:
        token_slots = np.repeat(slots, np.diff(layout.qo_indptr))
        laid_out = host_indices(layout) if int(layout.kv_indptr[-1]) <= HOST_PAGES else None
        sampled = sampling.host_arrays()
        arrays = [
            layout.input_ids,
            source,
            layout.positions,
            slots,
            layout.page_counts,
            layout.kv_indptr,
            token_slots,
            layout.sample_rows,
            *writes,
            *sampled,
            *(laid_out or ()),
        ]
        d = staging.upload(arrays)
        extra = 11 + len(sampled)
        return DeviceStep(
            input_ids=d[0],
            source=d[1],
            positions=d[2],
            slots=d[3],
            page_counts=d[4],
            kv_indptr=d[5],
            token_slots=d[6],
            sample_rows=d[7],
            writes=(d[8], d[9], d[10]),
            sampling=sampling.with_arrays(d[11:extra]),
            sourced=int(np.count_nonzero(source >= 0)),
            laid_out=(d[extra], d[extra + 1]) if laid_out is not None else None,
        )

    def resolve_ids(self, last_tokens: torch.Tensor | None) -> torch.Tensor:
        """Token ids with the previous step's samples filled in where ``source`` says."""
        if last_tokens is None or not self.sourced:
            return self.input_ids
        if self.sourced == self.input_ids.shape[0]:  # every row: one gather
            return last_tokens.index_select(0, self.source)
        last = last_tokens[self.source.clamp(min=0)]
        return torch.where(self.source >= 0, last, self.input_ids)

    def metadata(self, layout: StepLayout, table: RequestTable, pinned: bool) -> AttentionMetadata:
        table.apply(*self.writes)
        kv_indptr = layout.kv_indptr
        if self.laid_out is not None:
            kv_indices, out_slots = self.laid_out
        else:
            kv_indices, out_slots = AttentionMetadata.gather(
                table.pages,
                self.slots,
                self.page_counts,
                self.kv_indptr,
                int(kv_indptr[-1]),
                self.token_slots,
                self.positions,
                layout.page_size,
            )
        return AttentionMetadata(
            num_prefill=layout.num_prefill,
            qo_indptr=host_tensor(layout.qo_indptr, pinned),
            kv_indptr=host_tensor(kv_indptr, pinned),
            kv_lens=host_tensor(layout.kv_lens, pinned),
            last_page_len=host_tensor(layout.last_page_len, pinned),
            kv_indices=kv_indices,
            out_slots=out_slots,
            page_size=layout.page_size,
        )


def host_indices(layout: StepLayout) -> tuple[np.ndarray, np.ndarray]:
    """``(kv_indices, out_slots)`` of ``layout`` from its page tuples, as
    ``AttentionMetadata.gather`` finds them in the request table: int32 page ids, int64
    flat pool slots."""
    counts = layout.page_counts
    total = int(counts.sum())
    kv_indices = np.fromiter(
        chain.from_iterable(p[:c] for p, c in zip(layout.pages, counts.tolist(), strict=True)),
        dtype=np.int32,
        count=total,
    )
    seq = np.repeat(np.arange(layout.num_seqs), np.diff(layout.qo_indptr))
    size = layout.page_size
    positions = layout.positions
    page = kv_indices[layout.kv_indptr[seq] + positions // size].astype(np.int64)
    return kv_indices, page * size + positions % size
