"""Paged attention with FlashInfer on CUDA: one ``plan()`` per step, kernels per layer.

- Any step with a prefill chunk, and any step run eagerly, goes through the batch
  prefill wrapper (causal, ragged query rows; a decode row is a query of length 1
  at the end of its context), so prefix-cache hits and chunked prefill need
  nothing special.
- Pure decode steps inside CUDA graphs use FlashInfer's CUDA-graph decode
  wrappers, one per captured batch size, over shared fixed index buffers.

Decode uses the tensor-core kernels (the prefill module), so prefill and decode
share one compiled FlashInfer module. ``plan()`` writes its schedule into a pinned
host buffer and copies it to the device asynchronously; before the next
``plan()`` rewrites that buffer, the backend waits for the event recorded after
the previous one, which matters when the host plans step N+1 while the device
still runs step N. ``engine.attention.flashinfer_plan`` takes the longest
sequence of a plan on the tensor instead of element by element.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.attention import flashinfer_plan
from engine.attention.backend import AttentionBackend, flashinfer_pdl, register_backend
from engine.attention.metadata import AttentionMetadata
from engine.kvcache.pool import KVPool

WORKSPACE_BYTES = 256 * 1024 * 1024
HEAD_DIMS = (64, 128, 256)


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
        self.graph_wrappers: dict[int, Any] = {}
        self.wrapper: Any = None
        self.out_slots: torch.Tensor | None = None
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

    def _plan(
        self,
        wrapper: Any,
        meta: AttentionMetadata,
        out_slots: torch.Tensor,
        *lead: Any,
        **extra: Any,
    ) -> None:
        """Plan ``wrapper`` for ``meta`` (host-side) and point ``forward`` at it."""
        self._before_plan()
        wrapper.plan(
            *lead,
            meta.kv_indptr,
            meta.kv_indices,
            meta.last_page_len,
            self.num_q_heads,
            self.pool.num_kv_heads,
            self.pool.head_dim,
            meta.page_size,
            sm_scale=self.scale,
            q_data_type=self.pool.dtype,
            kv_data_type=self.pool.dtype,
            non_blocking=True,
            seq_lens=meta.kv_lens,
            **extra,
        )
        self._after_plan()
        self.wrapper = wrapper
        self.out_slots = out_slots

    def prepare(self, meta: AttentionMetadata) -> None:
        self._plan(self.prefill, meta, meta.out_slots, meta.qo_indptr, causal=True)

    def init_graphs(self, batch_sizes: list[int], max_pages: int) -> None:
        max_bs = max(batch_sizes)
        indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        for bs in batch_sizes:
            wrapper = self.fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                indptr[: bs + 1],
                indices,
                last_page_len[:bs],
                "NHD",
                use_tensor_cores=True,
            )
            self._share_int_workspace(wrapper)
            self.graph_wrappers[bs] = wrapper

    def prepare_graph(self, bs: int, meta: AttentionMetadata, out_slots: torch.Tensor) -> None:
        self._plan(self.graph_wrappers[bs], meta, out_slots)

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
        out: torch.Tensor = self.wrapper.run(
            q, (self.pool.k[layer], self.pool.v[layer]), enable_pdl=self.pdl
        )
        return out
