"""Paged attention in plain PyTorch (CPU or GPU), built on ``scaled_dot_product_attention``.

The reference backend, and the CPU path. Prefill chunks run one sequence at a
time: a chunk that starts at position 0 attends to its own K/V with a causal
mask; a later chunk (chunked prefill or a prefix-cache hit) gathers its whole
context from the pool and masks key ``j`` for query ``i`` unless
``j <= start + i``, in blocks of rows (``PREFIX_ROW_BLOCK``) that each read the
keys up to their own last row. Decode rows run as padded batches: sorted by context length
and cut wherever a row's context passes ``BUCKET_GROWTH`` times the first of its
batch, so that no batch pads a row to more than twice its length (one batch when
the lengths are close); each batch's contexts are gathered into ``[B, max_len]``
and the padding is masked. A batch of contexts from 100 to 4,000 tokens padded as
one would gather about three times the KV it reads.

Every gather lands in one pair of flat buffers (``_Workspace``) that each layer and step
reuses, grown to the largest gather so far. A fresh pair of tensors per layer would be
tens of MiB a step at a few thousand tokens of context per request: the host allocator
serves blocks that large with ``mmap`` and every layer pays their page faults again (a
SmolLM2 decode step of 32 x 2,049 contexts took 1.74 times as long that way,
``reports/cpu_speed/``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.scheduler.pages import pages_for
from engine.attention.backend import AttentionBackend, register_backend
from engine.attention.metadata import AttentionMetadata
from engine.kvcache.pool import KVPool


@dataclass(frozen=True, slots=True)
class _Chunk:
    rows: slice
    context_slots: torch.Tensor | None  # [context_len]; None when the chunk starts at 0
    mask: torch.Tensor | None  # [length, context_len] bool


BUCKET_GROWTH = 2
"""A decode batch ends before the first row whose context exceeds this many times its
first row's (rows sorted by context)."""


PREFIX_ROW_BLOCK = 256
"""A chunk after a cached prefix attends in blocks of this many rows, each over the keys up to
its own last row: one call over the whole context would compute every row against the
chunk's later keys too, and hold a ``[heads, rows, context]`` score block at once."""


@dataclass(frozen=True, slots=True)
class _Decode:
    rows: torch.Tensor | None  # [B] query rows of this batch; None: all decode rows in order
    batch: int
    max_len: int
    slots: torch.Tensor  # [B * max_len] flat slots, row-major, padded with a valid slot
    mask: torch.Tensor | None  # [B, 1, 1, max_len] bool; None when no padding


WORKSPACE_GROWTH = 1.5
"""A workspace too small for a gather grows to at least this many times its size, so that
contexts growing a token a step do not reallocate it at every step."""


class _Workspace:
    """The flat buffers that gathered K and V land in: ``[slots, kv_heads, D]`` each, as large
    as the largest gather so far (``WORKSPACE_GROWTH``), kept for the backend's life."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def gather(
        self, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``k_pool[slots]`` and ``v_pool[slots]``, views of the workspace valid until the
        next gather."""
        n = slots.numel()
        if self.k is None or self.v is None or self.k.shape[0] < n:
            size = max(n, int(WORKSPACE_GROWTH * (0 if self.k is None else self.k.shape[0])))
            self.k = self.v = None  # free the old pair before the new one is allocated
            self.k = k_pool.new_empty((size, *k_pool.shape[1:]))
            self.v = v_pool.new_empty((size, *v_pool.shape[1:]))
        ks = torch.index_select(k_pool, 0, slots, out=self.k[:n])
        vs = torch.index_select(v_pool, 0, slots, out=self.v[:n])
        return ks, vs


def length_buckets(lengths: list[int], growth: float = BUCKET_GROWTH) -> list[list[int]]:
    """Indices of ``lengths`` in ascending order of length, cut into runs whose longest is
    at most ``growth`` times their shortest."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    buckets: list[list[int]] = []
    for i in order:
        if not buckets or lengths[i] > growth * lengths[buckets[-1][0]]:
            buckets.append([])
        buckets[-1].append(i)
    return buckets


@register_backend
class TorchAttention(AttentionBackend):
    name = "torch"

    def __init__(self, pool: KVPool, num_q_heads: int, scale: float) -> None:
        super().__init__(pool, num_q_heads, scale)
        self.workspace = _Workspace()

    def prepare(self, meta: AttentionMetadata) -> None:
        ps = meta.page_size
        qo = meta.qo_indptr.tolist()
        kv = meta.kv_indptr.tolist()
        lens = meta.kv_lens.tolist()
        device = meta.kv_indices.device
        offsets = torch.arange(ps, device=device)
        self.chunks: list[_Chunk] = []
        for i in range(meta.num_prefill):
            rows = slice(qo[i], qo[i + 1])
            length, context = qo[i + 1] - qo[i], lens[i]
            if length == context:
                self.chunks.append(_Chunk(rows, None, None))
                continue
            pages = meta.kv_indices[kv[i] : kv[i + 1]].long()
            slots = (pages[:, None] * ps + offsets).reshape(-1)[:context]
            q_pos = torch.arange(context - length, context, device=device)
            causal = torch.arange(context, device=device)[None, :] <= q_pos[:, None]
            self.chunks.append(_Chunk(rows, slots, causal))
        self.decode: list[_Decode] = []
        self.decode_order: torch.Tensor | None = None  # outputs back to row order
        first = meta.num_prefill
        if meta.num_seqs > first:
            self.first_decode_row = qo[first]
            buckets = length_buckets(lens[first:])
            if len(buckets) == 1:  # one batch: in row order, no reordering
                buckets = [list(range(meta.num_seqs - first))]
            for bucket in buckets:
                seqs = [first + b for b in bucket]
                picked = None
                if len(buckets) > 1:
                    picked = torch.tensor(bucket, dtype=torch.int64, device=device)
                self.decode.append(self._decode_index(meta, seqs, picked, kv, lens, offsets))
            if len(buckets) > 1:
                sorted_rows = torch.tensor([b for bucket in buckets for b in bucket])
                self.decode_order = torch.argsort(sorted_rows).to(device)
        self.out_slots = meta.out_slots

    def _decode_index(
        self,
        meta: AttentionMetadata,
        seqs: list[int],
        rows: torch.Tensor | None,
        kv: list[int],
        lens: list[int],
        offsets: torch.Tensor,
    ) -> _Decode:
        ps = meta.page_size
        dec_lens = torch.tensor([lens[i] for i in seqs], dtype=torch.int64)
        max_len = int(dec_lens.max())
        max_pages = pages_for(max_len, ps)
        starts = torch.tensor([kv[i] for i in seqs], dtype=torch.int64)
        counts = torch.tensor([kv[i + 1] - kv[i] for i in seqs], dtype=torch.int64)
        column = torch.minimum(torch.arange(max_pages)[None, :], counts[:, None] - 1)
        index = (starts[:, None] + column).to(meta.kv_indices.device)
        pages = meta.kv_indices[index].long()  # [B, max_pages]
        slots = (pages[:, :, None] * ps + offsets).reshape(len(counts), -1)[:, :max_len]
        mask = None
        if int(dec_lens.min()) != max_len:
            valid = torch.arange(max_len)[None, :] < dec_lens[:, None]
            mask = valid[:, None, None, :].to(meta.kv_indices.device)
        return _Decode(rows, len(counts), max_len, slots.reshape(-1), mask)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        self.pool.write(layer, self.out_slots, k, v)
        k_pool, v_pool = self.pool.flat(layer)
        parts: list[torch.Tensor] = []
        for chunk in self.chunks:
            if chunk.context_slots is None or chunk.mask is None:
                parts.append(self._attend(q[chunk.rows], k[chunk.rows], v[chunk.rows], None))
                continue
            ks, vs = self.workspace.gather(k_pool, v_pool, chunk.context_slots)
            qs, start = q[chunk.rows], ks.shape[0] - (chunk.rows.stop - chunk.rows.start)
            for r0 in range(0, qs.shape[0], PREFIX_ROW_BLOCK):  # keys up to each block's last row
                r1 = min(r0 + PREFIX_ROW_BLOCK, qs.shape[0])
                n = start + r1
                parts.append(self._attend(qs[r0:r1], ks[:n], vs[:n], chunk.mask[r0:r1, :n]))
        if self.decode:
            q_decode = q[self.first_decode_row :]
            outs = []
            for d in self.decode:
                shape = (d.batch, d.max_len, k.shape[1], k.shape[2])
                kd, vd = self.workspace.gather(k_pool, v_pool, d.slots)
                kd, vd = kd.view(shape).transpose(1, 2), vd.view(shape).transpose(1, 2)
                qd = q_decode if d.rows is None else q_decode.index_select(0, d.rows)
                o = F.scaled_dot_product_attention(
                    qd[:, :, None, :], kd, vd, attn_mask=d.mask, scale=self.scale, enable_gqa=True
                )
                outs.append(o[:, :, 0, :])
            if self.decode_order is None:
                parts.append(outs[0])
            else:
                parts.append(torch.cat(outs).index_select(0, self.decode_order))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Rows ``q`` ``[L, heads, D]`` over ``k``/``v`` ``[S, kv_heads, D]``: with ``mask``
        ``[L, S]``, or causal when there is none."""
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
            enable_gqa=True,
        )
        return o[0].transpose(0, 1)
