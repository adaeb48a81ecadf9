"""Paged attention with FlashInfer on CUDA: plans once per step, kernels per layer.

- A step's prefill chunks go through the batch prefill wrapper (causal, ragged
  query rows), so prefix-cache hits and chunked prefill need nothing special.
- Its decode rows, in a mixed step or an eager decode step, are planned apart,
  on a second wrapper (one query row a sequence: the tensor-core decode), once
  one of them is longer than two of the shortest pieces (8,192 tokens): planned
  with the chunk they would get its query tile of 128 rows for their one token,
  and no split of their KV once the chunk fills the GPU (one CTA per head walks
  the whole context: a 120k-token decode row made a 2,048-token prefill step 3x
  longer). Shorter, they stay with the chunk (one plan and one kernel a layer:
  an eager step is bound by the host's launches). A decode row much longer than
  the others is cut into pieces (``engine.attention.decode_pieces``); a decode
  step with such a row runs eagerly instead of from its graph.
- Other pure decode steps run inside CUDA graphs with FlashInfer's CUDA-graph
  decode wrappers, one per captured batch size, over shared fixed index buffers.

``SERVELAB_SPLIT_DECODE_ROWS=0`` sends every row of an eager step through the
prefill wrapper and never cuts (as before the split, to compare);
``SERVELAB_DECODE_PIECE_TOKENS`` sets the shortest piece (4,096 tokens).

Decode uses the tensor-core kernels (the prefill module), so prefill and decode
share one compiled FlashInfer module. ``plan()`` writes its schedule into a pinned
host buffer and copies it to the device asynchronously; before the next step's
plans rewrite those buffers, the backend waits for the event recorded after the
last ones, which matters when the host plans step N+1 while the device still
runs step N. ``engine.attention.flashinfer_plan`` takes the longest sequence of
a plan on the tensor instead of element by element.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.attention import decode_pieces, flashinfer_plan
from engine.attention.backend import AttentionBackend, flashinfer_pdl, register_backend
from engine.attention.metadata import AttentionMetadata, host_tensor
from engine.kvcache.pool import KVPool

WORKSPACE_BYTES = 256 * 1024 * 1024
DECODE_WORKSPACE_BYTES = 64 * 1024 * 1024
MAX_CTA_TILE_Q = 128  # the largest query tile of FlashInfer's FA2 prefill kernels
HEAD_DIMS = (64, 128, 256)
MIN_PIECE_TOKENS = 4096
CTAS_PER_SM = 2  # FlashInfer's budget for splitting KV: two CTAs a SM, per KV head


def split_decode_rows() -> bool:
    """Whether eager steps attend decode rows apart: yes unless ``SERVELAB_SPLIT_DECODE_ROWS=0``."""
    return os.environ.get("SERVELAB_SPLIT_DECODE_ROWS", "1") != "0"


def min_piece_tokens() -> int:
    """The shortest piece a long decode row is cut into (``SERVELAB_DECODE_PIECE_TOKENS``)."""
    value = os.environ.get("SERVELAB_DECODE_PIECE_TOKENS", str(MIN_PIECE_TOKENS))
    tokens = int(value)
    if tokens < 1:
        raise ValueError(f"SERVELAB_DECODE_PIECE_TOKENS must be a positive number, not {value!r}")
    return tokens


@dataclass(frozen=True, slots=True)
class _DecodePart:
    """A step's decode rows, planned on a wrapper of their own: query rows from ``first_row``
    on; with pieces, the decode row each piece queries and the buffers ``merge`` reads."""

    first_row: int
    q_rows: torch.Tensor | None = None
    merge_index: torch.Tensor | None = None
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None


@register_backend
class FlashInferAttention(AttentionBackend):
    name = "flashinfer"
    supports_graphs = True

    @classmethod
    def unsupported(cls, device_type: str, dtype: torch.dtype, head_dim: int) -> str | None:
        if device_type != "cuda":
            return "it runs on CUDA only"
        if dtype not in (torch.float16, torch.bfloat16):
            return f"it needs float16 or bfloat16, not {dtype}"
        if head_dim not in HEAD_DIMS:
            return f"head dim {head_dim} is not one of {HEAD_DIMS}"
        return None

    def __init__(self, pool: KVPool, num_q_heads: int, scale: float) -> None:
        super().__init__(pool, num_q_heads, scale)
        import flashinfer
        import flashinfer.decode
        import flashinfer.prefill

        self.fi = flashinfer
        flashinfer_plan.install([flashinfer.decode, flashinfer.prefill])
        self.pdl = flashinfer_pdl()
        self.device = pool.device
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2"
        )
        self.decode: Any = None
        if split_decode_rows():
            # a prefill wrapper with one query row a sequence is the tensor-core decode (same
            # plan, same kernels) and takes its query offsets from the pinned host buffer given
            self.decode = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                torch.zeros(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device),
                "NHD",
                backend="fa2",
            )
        self.min_piece = min_piece_tokens()
        self.merge = decode_pieces.merge
        if importlib.util.find_spec("triton") is not None:
            from engine.attention import merge_kernel

            self.merge = merge_kernel.merge
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.slots = CTAS_PER_SM * sms // pool.num_kv_heads
        self.graph_wrappers: dict[tuple[int, int], Any] = {}  # (width, batch size)
        self.wrapper: Any = None
        self.out_slots: torch.Tensor | None = None
        self._decode_part: _DecodePart | None = None
        self._planned: torch.cuda.Event | None = None
        self._flat = [pool.flat(layer) for layer in range(len(pool.k))]

    def _share_int_workspace(self, wrapper: Any) -> None:
        wrapper._int_workspace_buffer = self.prefill._int_workspace_buffer
        wrapper._pin_memory_int_workspace_buffer = self.prefill._pin_memory_int_workspace_buffer

    def _before_plan(self) -> None:
        if self._planned is not None:
            self._planned.synchronize()

    def _after_plan(self) -> None:
        self._planned = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._planned.record()

    def _plan_one(
        self,
        wrapper: Any,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        last_page_len: torch.Tensor,
        kv_lens: torch.Tensor,
        *lead: Any,
        **extra: Any,
    ) -> None:
        wrapper.plan(
            *lead,
            kv_indptr,
            kv_indices,
            last_page_len,
            self.num_q_heads,
            self.pool.num_kv_heads,
            self.pool.head_dim,
            self.pool.page_size,
            sm_scale=self.scale,
            q_data_type=self.pool.dtype,
            kv_data_type=self.pool.dtype,
            non_blocking=True,
            seq_lens=kv_lens,
            **extra,
        )

    def _plan(
        self,
        wrapper: Any,
        meta: AttentionMetadata,
        out_slots: torch.Tensor,
        *lead: Any,
        **extra: Any,
    ) -> None:
        """Plan ``wrapper`` for every row of ``meta`` (host-side) and point ``attend`` at it."""
        self._before_plan()
        self._plan_one(
            wrapper,
            meta.kv_indptr,
            meta.kv_indices,
            meta.last_page_len,
            meta.kv_lens,
            *lead,
            **extra,
        )
        self._after_plan()
        self.wrapper = wrapper
        self._decode_part = None
        self.out_slots = out_slots

    def _pieces(self, meta: AttentionMetadata, padding: int = 0) -> decode_pieces.Pieces | None:
        """The cut of ``meta``'s decode rows (``decode_pieces.plan_cut``)."""
        n = meta.num_prefill
        return decode_pieces.plan_cut(
            meta.kv_lens[n:].numpy(),
            meta.last_page_len[n:].numpy(),
            meta.page_size,
            self.slots,
            self.min_piece,
            padding,
        )

    def graph_fits(self, meta: AttentionMetadata, bs: int) -> bool:
        if self.decode is None or meta.num_prefill:  # extends plan on the prefill wrapper
            return True
        return self._pieces(meta, bs - meta.num_seqs) is None

    def prepare(self, meta: AttentionMetadata) -> None:
        n = meta.num_prefill
        if (
            self.decode is None
            or n == meta.num_seqs
            or int(meta.kv_lens[n:].max()) <= 2 * self.min_piece
        ):
            self._plan(self.prefill, meta, meta.out_slots, meta.qo_indptr, causal=True)
            return
        self._before_plan()
        first_row = int(meta.qo_indptr[n])
        base = int(meta.kv_indptr[n])
        if n:
            self._plan_one(
                self.prefill,
                meta.kv_indptr[: n + 1],
                meta.kv_indices[:base],
                meta.last_page_len[:n],
                meta.kv_lens[:n],
                meta.qo_indptr[: n + 1],
                causal=True,
            )
        self._decode_part = self._plan_decode(meta, first_row, base)
        self._after_plan()
        self.wrapper = None
        self.out_slots = meta.out_slots

    def _plan_decode(self, meta: AttentionMetadata, first_row: int, base: int) -> _DecodePart:
        n = meta.num_prefill
        pieces = self._pieces(meta)
        kv_indices = meta.kv_indices[base:]
        if pieces is None:
            rows = meta.num_seqs - n
            self._plan_one(
                self.decode,
                host_tensor(meta.kv_indptr[n:].numpy() - base, pinned=True),
                kv_indices,
                meta.last_page_len[n:],
                meta.kv_lens[n:],
                host_tensor(np.arange(rows + 1, dtype=np.int32), pinned=True),
                causal=False,
            )
            return _DecodePart(first_row)
        self._plan_one(
            self.decode,
            host_tensor(pieces.kv_indptr, pinned=True),
            kv_indices,
            host_tensor(pieces.last_page_len, pinned=True),
            host_tensor(pieces.kv_lens, pinned=True),
            host_tensor(np.arange(pieces.num_pieces + 1, dtype=np.int32), pinned=True),
            causal=False,
        )
        count, heads, dim = pieces.num_pieces, self.num_q_heads, self.pool.head_dim
        return _DecodePart(
            first_row,
            q_rows=host_tensor(pieces.owner, pinned=True).to(self.device, non_blocking=True),
            merge_index=host_tensor(pieces.merge_index, pinned=True).to(
                self.device, non_blocking=True
            ),
            out=torch.zeros(count + 1, heads, dim, dtype=self.pool.dtype, device=self.device),
            lse=torch.full((count + 1, heads), float("-inf"), device=self.device),
        )

    def graph_batch_limit(self, width: int) -> int:
        """At width 1, no limit; above, the most sequences whose graph's split-KV buffers fit
        the float workspace. In CUDA-graph mode FlashInfer's prefill plan always splits the KV
        and sizes its buffers for the worst case: query tiles of up to ``MAX_CTA_TILE_Q`` rows,
        ``ceil(rows * group / tile) + bs - 1`` of them (at least ``2 * SMs / kv_heads``), each
        holding a float partial output and log-sum-exp per head; past that the plan overruns
        the workspace (a crash, not an error)."""
        if width == 1:
            return 1 << 30
        heads, dim, kv_heads = self.num_q_heads, self.pool.head_dim, self.pool.num_kv_heads
        group = heads // kv_heads
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        bs = 0
        while True:
            n = bs + 1
            tiles = -(-n * width * group // MAX_CTA_TILE_Q) + n - 1
            tiles = max(tiles, 2 * sms // kv_heads)
            need = heads * tiles * MAX_CTA_TILE_Q * (dim + 1) * 4
            if need > WORKSPACE_BYTES * 0.9:
                return bs
            bs = n

    def init_graphs(self, batch_sizes: list[int], max_pages: int, width: int) -> None:
        max_bs = max(batch_sizes)
        indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        for bs in batch_sizes:
            if width == 1:
                wrapper = self.fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                    self.workspace,
                    indptr[: bs + 1],
                    indices,
                    last_page_len[:bs],
                    "NHD",
                    use_tensor_cores=True,
                )
            else:  # a verify step: ``width`` rows a sequence, causal over its context
                wrapper = self.fi.BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace,
                    "NHD",
                    use_cuda_graph=True,
                    qo_indptr_buf=qo_indptr[: bs + 1],
                    paged_kv_indptr_buf=indptr[: bs + 1],
                    paged_kv_indices_buf=indices,
                    paged_kv_last_page_len_buf=last_page_len[:bs],
                    backend="fa2",
                )
            self._share_int_workspace(wrapper)
            self.graph_wrappers[(width, bs)] = wrapper

    def prepare_graph(
        self, bs: int, meta: AttentionMetadata, out_slots: torch.Tensor, width: int
    ) -> None:
        wrapper = self.graph_wrappers[(width, bs)]
        if width == 1:
            self._plan(wrapper, meta, out_slots)
        else:
            self._plan(wrapper, meta, out_slots, meta.qo_indptr, causal=True)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        assert self.out_slots is not None, "prepare() first"
        self.pool.write(layer, self.out_slots, k, v)
        return self.attend(layer, q)

    def kv_store(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        assert self.out_slots is not None, "prepare() first"
        k_flat, v_flat = self._flat[layer]
        return k_flat, v_flat, self.out_slots

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        kv = (self.pool.k[layer], self.pool.v[layer])
        part = self._decode_part
        if part is None:
            out: torch.Tensor = self.wrapper.run(q, kv, enable_pdl=self.pdl)
            return out
        q_decode = q[part.first_row :]
        if part.q_rows is None:
            decoded: torch.Tensor = self.decode.run(q_decode, kv, enable_pdl=self.pdl)
        else:
            assert part.out is not None and part.lse is not None and part.merge_index is not None
            self.decode.run(
                q_decode.index_select(0, part.q_rows),
                kv,
                out=part.out[:-1],
                lse=part.lse[:-1],
                return_lse=True,
                enable_pdl=self.pdl,
            )
            decoded = self.merge(part.out, part.lse, part.merge_index)
        if part.first_row == 0:
            return decoded
        prefilled: torch.Tensor = self.prefill.run(q[: part.first_row], kv, enable_pdl=self.pdl)
        return torch.cat((prefilled, decoded))
