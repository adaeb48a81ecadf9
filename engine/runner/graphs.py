"""Decode steps replayed from CUDA graphs, one graph per padded batch size.

At start-up the model's forward pass (embedding, every layer, final norm) is
captured for each batch size in ``batch_sizes()`` (largest first, all graphs
sharing one memory pool), over fixed input buffers: token ids, positions and KV
write slots. A decode step of ``n`` requests replays the graph of the smallest
captured size ``bs >= n``: the inputs are copied into the buffers, rows
``n..bs-1`` are padding (token 0 at position 0, writing and reading only the
pool's scratch page), the attention backend plans its buffers for the padded
batch, and the hidden states of the first ``n`` rows are read back. Logits and
sampling run eagerly after the replay, on the rows that sample.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata, host_tensor
from engine.kvcache.pool import KVPool
from engine.models.llama import LlamaForCausalLM

log = logging.getLogger(__name__)


def batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, 48, 64, then every multiple of 32 up to ``max_bs`` (and ``max_bs``).

    Coarse steps cost little: a decode step reads the weights once whatever the batch, and
    padding rows attend to one scratch token.
    """
    small = [1, 2, 4, 8, 16, 32, 48, 64]
    sizes = [s for s in small if s < max_bs] + list(range(96, max_bs, 32))
    return sorted({*sizes, max_bs})


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaForCausalLM,
        attention: AttentionBackend,
        pool: KVPool,
        max_bs: int,
        max_pages_per_seq: int,
    ) -> None:
        self.model = model
        self.attention = attention
        self.pool = pool
        self.sizes = batch_sizes(max_bs)
        self.max_bs = max_bs
        device = pool.device
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_slots = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.scratch_slot = pool.scratch_page * pool.page_size
        self.scratch_pages = torch.full(
            (max_bs,), pool.scratch_page, dtype=torch.int32, device=device
        )
        attention.init_graphs(self.sizes, max_bs * max_pages_per_seq)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.replays = 0
        self.capture_s: dict[int, tuple[float, float]] = {}

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every batch size; returns the seconds it took (per size in ``capture_s``)."""
        start = time.perf_counter()
        self.out_slots.fill_(self.scratch_slot)
        mem_pool = None
        for bs in reversed(self.sizes):
            t0 = time.perf_counter()
            meta = self._padding_meta(bs)
            self.attention.prepare_graph(bs, meta, self.out_slots[:bs])
            self._forward(bs)  # warm-up: kernels load, workspaces are allocated
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=mem_pool):
                self.outputs[bs] = self._forward(bs)
            mem_pool = graph.pool()
            self.graphs[bs] = graph
            self.capture_s[bs] = (t1 - t0, time.perf_counter() - t1)
        torch.cuda.synchronize()
        log.debug("capture seconds (warm-up, capture) by batch size: %s", self.capture_s)
        return time.perf_counter() - start

    def release(self) -> None:
        """Free every captured graph (they may hold NCCL collectives; see ``ModelRunner.close``)."""
        torch.cuda.synchronize()
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.outputs.clear()

    def _forward(self, bs: int) -> torch.Tensor:
        hidden: torch.Tensor = self.model(self.input_ids[:bs], self.positions[:bs], self.attention)
        return hidden

    def bucket(self, n: int) -> int | None:
        """The captured batch size that ``n`` decode rows replay in, or None (run eagerly)."""
        if n > self.max_bs:
            return None
        for bs in self.sizes:
            if bs >= n:
                return bs
        return None

    def replay(
        self, bs: int, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states ``[n, hidden]`` of a decode step of ``n <= bs`` rows."""
        n = int(input_ids.shape[0])
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.out_slots[:n].copy_(meta.out_slots)
        if n < bs:
            self.input_ids[n:bs].zero_()
            self.positions[n:bs].zero_()
            self.out_slots[n:bs].fill_(self.scratch_slot)
            meta = self._pad(meta, bs)
        self.attention.prepare_graph(bs, meta, self.out_slots[:bs])
        self.graphs[bs].replay()
        self.replays += 1
        return self.outputs[bs][:n]

    def _padding_meta(self, bs: int) -> AttentionMetadata:
        """``bs`` sequences of one token each, all on the scratch page."""
        ones = np.ones(bs, dtype=np.int32)
        pinned = self.pool.device.type == "cuda"
        return AttentionMetadata(
            num_prefill=0,
            qo_indptr=host_tensor(np.arange(bs + 1, dtype=np.int32), pinned),
            kv_indptr=host_tensor(np.arange(bs + 1, dtype=np.int32), pinned),
            kv_lens=host_tensor(ones, pinned),
            last_page_len=host_tensor(ones, pinned),
            kv_indices=self.scratch_pages[:bs],
            out_slots=self.out_slots[:bs],
            page_size=self.pool.page_size,
        )

    def _pad(self, meta: AttentionMetadata, bs: int) -> AttentionMetadata:
        """``meta`` with ``bs - n`` one-token sequences on the scratch page appended."""
        n = meta.num_seqs
        pad = bs - n
        kv_indptr = meta.kv_indptr.numpy()
        pinned = self.pool.device.type == "cuda"
        ones = np.ones(pad, dtype=np.int32)
        tail = kv_indptr[-1] + np.arange(1, pad + 1, dtype=np.int32)
        return AttentionMetadata(
            num_prefill=0,
            qo_indptr=host_tensor(np.arange(bs + 1, dtype=np.int32), pinned),
            kv_indptr=host_tensor(np.concatenate((kv_indptr, tail)), pinned),
            kv_lens=host_tensor(np.concatenate((meta.kv_lens.numpy(), ones)), pinned),
            last_page_len=host_tensor(np.concatenate((meta.last_page_len.numpy(), ones)), pinned),
            kv_indices=torch.cat((meta.kv_indices, self.scratch_pages[:pad])),
            out_slots=self.out_slots[:bs],
            page_size=meta.page_size,
        )
