"""A step of short extends laid out again as one of ``width`` rows a sequence, the shape a
verify graph replays (``engine.runner.graphs``).

Under speculative decoding most steps are verify spans of ``1 + K`` rows, but some slots
carry a shorter draft (near their output limit) or none (a plain decode row), and a short
prefill chunk may run beside them. Each such sequence of ``r <= width`` rows becomes one of
``width``: its ``r`` rows first, then ``width - r`` padding rows after them, as if its
context were ``width - r`` positions longer. Causal attention gives row ``i`` of a sequence
the positions up to ``kv_len - rows + i``, so the real rows see what they saw before and
never the padding's positions; the padding rows read whatever those positions hold (the
slots past the sequence's last written one in its last page, then the pool's scratch page)
and write their K/V to the scratch page only. The hidden states of the real rows are read
back through ``Widened.rows``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention.metadata import AttentionMetadata, host_tensor


@dataclass(frozen=True, slots=True)
class Widened:
    input_ids: torch.Tensor  # int64 [n * width]
    positions: torch.Tensor  # int64 [n * width]
    meta: AttentionMetadata  # n extends of ``width`` rows each
    rows: torch.Tensor  # int64 [T]: the widened row of each row of the step


def widen(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    meta: AttentionMetadata,
    width: int,
    scratch_page: int,
) -> Widened:
    """The step ``meta`` (every sequence at most ``width`` rows) as ``width`` rows a sequence;
    ``ValueError`` if a sequence is longer. No device work waits for the stream: the row and
    page maps go up from pinned memory on CUDA."""
    qo = meta.qo_indptr.numpy().astype(np.int64)
    n = len(qo) - 1
    rows = np.diff(qo)
    if len(rows) and int(rows.max()) > width:
        raise ValueError(f"a sequence of {int(rows.max())} rows does not widen to {width}")
    page_size = meta.page_size
    dest = np.repeat(width * np.arange(n) - qo[:-1], rows) + np.arange(qo[-1])
    kv_lens = (meta.kv_lens.numpy() + (width - rows)).astype(np.int32)
    old_indptr = meta.kv_indptr.numpy().astype(np.int64)
    kv_indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(-(-kv_lens // page_size), out=kv_indptr[1:])
    shift = kv_indptr[:-1] - old_indptr[:-1]
    page_dest = np.repeat(shift, np.diff(old_indptr)) + np.arange(old_indptr[-1])
    device = input_ids.device
    pinned = device.type == "cuda"
    maps = host_tensor(np.concatenate((dest, page_dest)).astype(np.int64), pinned)
    maps = maps.to(device, non_blocking=True)
    row_map, page_map = maps[: len(dest)], maps[len(dest) :]
    total = n * width
    out_slots = meta.out_slots.new_full((total,), scratch_page * page_size)
    kv_indices = meta.kv_indices.new_full((int(kv_indptr[-1]),), scratch_page)
    return Widened(
        input_ids=input_ids.new_zeros(total).index_copy_(0, row_map, input_ids),
        positions=positions.new_zeros(total).index_copy_(0, row_map, positions),
        meta=AttentionMetadata(
            num_prefill=n,
            qo_indptr=host_tensor(width * np.arange(n + 1, dtype=np.int32), pinned),
            kv_indptr=host_tensor(kv_indptr, pinned),
            kv_lens=host_tensor(kv_lens, pinned),
            last_page_len=host_tensor((kv_lens - 1) % page_size + 1, pinned),
            kv_indices=kv_indices.index_copy_(0, page_map, meta.kv_indices),
            out_slots=out_slots.index_copy_(0, row_map, meta.out_slots),
            page_size=page_size,
        ),
        rows=row_map,
    )
