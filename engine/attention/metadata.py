"""What attention needs to know about one step, shared by every backend.

Sequences are laid out as in ``engine.runner.layout`` (prefill chunks, then
decode slots). Per sequence ``i``: query rows ``qo_indptr[i]:qo_indptr[i+1]``,
``kv_lens[i]`` context positions held in the pages
``kv_indices[kv_indptr[i]:kv_indptr[i+1]]`` (the last one holding
``last_page_len[i]`` tokens). Each row writes its new K/V to the flat pool slot
``out_slots[row] = page * page_size + offset``. The small per-sequence arrays
live on the host (pinned on CUDA, as FlashInfer's ``plan()`` reads them there);
``kv_indices`` and ``out_slots`` are gathered on the device from the request
table, so no per-page data crosses from the host each step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    num_prefill: int
    qo_indptr: torch.Tensor  # int32 [N + 1], host
    kv_indptr: torch.Tensor  # int32 [N + 1], host
    kv_lens: torch.Tensor  # int32 [N], host
    last_page_len: torch.Tensor  # int32 [N], host
    kv_indices: torch.Tensor  # int32 [kv_indptr[-1]], device
    out_slots: torch.Tensor  # int64 [T], device
    page_size: int

    @property
    def num_seqs(self) -> int:
        return int(self.kv_lens.shape[0])

    @property
    def is_decode(self) -> bool:
        return self.num_prefill == 0

    @staticmethod
    def gather(
        table: torch.Tensor,
        slots: torch.Tensor,
        page_counts: torch.Tensor,
        kv_indptr: torch.Tensor,
        total_pages: int,
        token_slots: torch.Tensor,
        positions: torch.Tensor,
        page_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(kv_indices, out_slots)`` from the request table, on its device, without a sync.

        ``slots``, ``page_counts``, ``kv_indptr`` are per sequence; ``token_slots``
        and ``positions`` per row.
        """
        device = table.device
        seq = torch.arange(slots.shape[0], device=device)
        page_seq = torch.repeat_interleave(seq, page_counts, output_size=total_pages)
        column = torch.arange(total_pages, device=device) - kv_indptr[page_seq]
        kv_indices = table[slots[page_seq].long(), column]
        page = table[token_slots.long(), positions // page_size].long()
        return kv_indices, page * page_size + positions % page_size


def host_tensor(array: np.ndarray, pinned: bool) -> torch.Tensor:
    """``array`` as a CPU tensor; pinned (from torch's caching host allocator) on CUDA."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    return t.pin_memory() if pinned else t
