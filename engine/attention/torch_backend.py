"""Paged attention in plain PyTorch (CPU or GPU), built on ``scaled_dot_product_attention``.

Prefill chunks run one request at a time: a chunk that starts at position 0
attends to its own K/V with a causal mask; a later chunk (chunked prefill or a
prefix-cache hit) gathers its whole context from the pool and masks key ``j``
for query ``i`` unless ``j <= start + i``. All decode rows run as one padded
batch: their contexts are gathered into ``[B, max_len]`` and padding is masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionBackend, register_backend
from engine.attention.batch import ForwardBatch, SeqSpan


@dataclass(frozen=True, slots=True)
class _ChunkIndex:
    span: SeqSpan
    context_slots: torch.Tensor | None  # [context_len]; None when the chunk starts at 0
    mask: torch.Tensor | None  # [length, context_len] bool


@dataclass(frozen=True, slots=True)
class _DecodeIndex:
    first_row: int
    batch: int
    max_len: int
    slots: torch.Tensor  # [B * max_len] flat slots, row-major, padded with slot 0
    mask: torch.Tensor | None  # [B, 1, 1, max_len] bool; None when no padding


def _context_slots(span: SeqSpan, page_size: int, device: torch.device) -> torch.Tensor:
    pos = torch.arange(span.context_len, dtype=torch.int64)
    table = torch.tensor(span.pages, dtype=torch.int64)
    return (table[pos // page_size] * page_size + pos % page_size).to(device)


@register_backend
class TorchAttention(AttentionBackend):
    name = "torch"

    def prepare(self, batch: ForwardBatch) -> None:
        device = batch.input_ids.device
        ps = batch.page_size
        self.chunks: list[_ChunkIndex] = []
        for span in batch.prefill:
            if span.start == 0:
                self.chunks.append(_ChunkIndex(span, None, None))
                continue
            q_pos = torch.arange(span.start, span.context_len, device=device)
            k_pos = torch.arange(span.context_len, device=device)
            causal = k_pos[None, :] <= q_pos[:, None]
            self.chunks.append(_ChunkIndex(span, _context_slots(span, ps, device), causal))
        self.decode: _DecodeIndex | None = None
        if batch.decode:
            lens = torch.tensor([s.context_len for s in batch.decode], dtype=torch.int64)
            max_len = int(lens.max())
            max_pages = -(-max_len // ps)
            table = torch.zeros((len(batch.decode), max_pages), dtype=torch.int64)
            for i, s in enumerate(batch.decode):
                n = -(-s.context_len // ps)
                table[i, :n] = torch.tensor(s.pages[:n], dtype=torch.int64)
            pos = torch.arange(max_len, dtype=torch.int64)
            slots = table[:, pos // ps] * ps + pos % ps
            mask: torch.Tensor | None = None
            if int(lens.min()) != max_len:
                mask = (pos[None, :] < lens[:, None])[:, None, None, :].to(device)
            self.decode = _DecodeIndex(
                batch.decode[0].row, len(batch.decode), max_len, slots.view(-1).to(device), mask
            )
        self.slots = batch.slots

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        self.pool.write(layer, self.slots, k, v)
        k_pool, v_pool = self.pool.flat(layer)
        parts: list[torch.Tensor] = []
        for chunk in self.chunks:
            rows = slice(chunk.span.row, chunk.span.row + chunk.span.length)
            if chunk.context_slots is None:
                ks, vs = k[rows], v[rows]
            else:
                ks = k_pool.index_select(0, chunk.context_slots)
                vs = v_pool.index_select(0, chunk.context_slots)
            o = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1)[None],
                ks.transpose(0, 1)[None],
                vs.transpose(0, 1)[None],
                attn_mask=chunk.mask,
                is_causal=chunk.mask is None,
                scale=self.scale,
                enable_gqa=True,
            )
            parts.append(o[0].transpose(0, 1))
        if self.decode is not None:
            d = self.decode
            shape = (d.batch, d.max_len, k.shape[1], k.shape[2])
            kd = k_pool.index_select(0, d.slots).view(shape).transpose(1, 2)
            vd = v_pool.index_select(0, d.slots).view(shape).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q[d.first_row :, :, None, :],
                kd,
                vd,
                attn_mask=d.mask,
                scale=self.scale,
                enable_gqa=True,
            )
            parts.append(o[:, :, 0, :])
        return parts[0] if len(parts) == 1 else torch.cat(parts)
