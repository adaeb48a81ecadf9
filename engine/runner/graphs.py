"""Steps replayed from CUDA graphs: one graph per padded batch size, for one row width.

A ``StepGraphs`` captures steps whose every sequence has ``width`` query rows:
width 1 is the decode step, width ``1 + K`` the verify step of speculative
decoding (each slot feeds its token and a draft of ``K``; the runner captures
both, sharing one memory pool). At start-up the model's forward pass
(embedding, every layer, final norm) is captured for each batch size in
``batch_sizes()`` (largest first), over fixed input buffers: token ids,
positions and KV write slots. A step of ``n`` sequences replays the graph of
the smallest captured size ``bs >= n``: the inputs are copied into the buffers,
sequences ``n..bs-1`` are padding (``width`` tokens at position 0, writing and
reading only the pool's scratch page), the attention backend plans its buffers
for the padded batch (decode attention at width 1, causal extends above), and
the hidden states of the first ``n * width`` rows are read back. Logits and
sampling run eagerly after the replay, on the rows that sample. A step of
shorter extends (drafts cut short near their output limit, plain decode slots
beside verify spans, a short prefill chunk) replays the verify graph once
widened to its shape (``engine.runner.widen``); a step with a longer prefill
chunk runs eagerly.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from core.scheduler.pages import pages_for
from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata, host_tensor
from engine.kvcache.pool import KVPool
from engine.models.llama import LlamaForCausalLM
from engine.runner.widen import widen

log = logging.getLogger(__name__)


def batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, 48, 64, then every multiple of 32 up to ``max_bs`` (and ``max_bs``).

    Coarse steps cost little: a decode step reads the weights once whatever the batch, and
    padding rows attend to one scratch token.
    """
    small = [1, 2, 4, 8, 16, 32, 48, 64]
    sizes = [s for s in small if s < max_bs] + list(range(96, max_bs, 32))
    return sorted({*sizes, max_bs})


class StepGraphs:
    def __init__(
        self,
        model: LlamaForCausalLM,
        attention: AttentionBackend,
        pool: KVPool,
        max_bs: int,
        max_pages_per_seq: int,
        width: int = 1,
    ) -> None:
        self.model = model
        self.attention = attention
        self.pool = pool
        self.sizes = batch_sizes(max_bs)
        self.width = width
        device = pool.device
        rows = max_bs * width
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.out_slots = torch.zeros(rows, dtype=torch.int64, device=device)
        self.scratch_slot = pool.scratch_page * pool.page_size
        self.scratch_pages = torch.full(  # as many as ``max_bs`` padding sequences span
            (max_bs * pages_for(width, pool.page_size),),
            pool.scratch_page,
            dtype=torch.int32,
            device=device,
        )
        attention.init_graphs(self.sizes, max_bs * max_pages_per_seq, width)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.replays = 0
        self.capture_s: dict[int, tuple[float, float]] = {}
        self.mem_pool: Any = None

    @torch.inference_mode()
    def capture(self, mem_pool: Any = None) -> float:
        """Capture every batch size into ``mem_pool`` (another set's ``mem_pool``, or a new
        one); returns the seconds it took (per size in ``capture_s``)."""
        start = time.perf_counter()
        self.out_slots.fill_(self.scratch_slot)
        for bs in reversed(self.sizes):
            t0 = time.perf_counter()
            meta = self._padded(None, bs)
            self.attention.prepare_graph(bs, meta, self.out_slots[: bs * self.width], self.width)
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
        self.mem_pool = mem_pool
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
        rows = bs * self.width
        hidden: torch.Tensor = self.model(
            self.input_ids[:rows], self.positions[:rows], self.attention
        )
        return hidden

    def bucket(self, n: int) -> int | None:
        """The captured batch size that ``n`` sequences replay in, or None (run eagerly)."""
        return next((bs for bs in self.sizes if bs >= n), None)

    def replay(
        self, bs: int, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states ``[rows, hidden]`` of a step of ``n <= bs`` sequences."""
        rows = int(input_ids.shape[0])
        padded = bs * self.width
        self.input_ids[:rows].copy_(input_ids)
        self.positions[:rows].copy_(positions)
        self.out_slots[:rows].copy_(meta.out_slots)
        if rows < padded:
            self.input_ids[rows:padded].zero_()
            self.positions[rows:padded].zero_()
            self.out_slots[rows:padded].fill_(self.scratch_slot)
            meta = self._padded(meta, bs)
        self.attention.prepare_graph(bs, meta, self.out_slots[:padded], self.width)
        self.graphs[bs].replay()
        self.replays += 1
        return self.outputs[bs][:rows]

    def replay_widened(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor | None:
        """Hidden states ``[rows, hidden]`` of a step of extends of at most ``width`` rows
        each, laid out at ``width`` rows a sequence (``engine.runner.widen``); None (run it
        eagerly) for a decode width, a longer sequence or more sequences than captured."""
        bs = self.bucket(meta.num_seqs)
        longest = int(np.diff(meta.qo_indptr.numpy()).max())
        if self.width == 1 or bs is None or longest > self.width:
            return None
        step = widen(input_ids, positions, meta, self.width, self.pool.scratch_page)
        hidden = self.replay(bs, step.input_ids, step.positions, step.meta)
        return hidden.index_select(0, step.rows)

    def _padded(self, meta: AttentionMetadata | None, bs: int) -> AttentionMetadata:
        return padded(meta, bs, self.width, self.pool.page_size, self.scratch_pages, self.out_slots)


def padded(
    meta: AttentionMetadata | None,
    bs: int,
    width: int,
    page_size: int,
    scratch_pages: torch.Tensor,
    out_slots: torch.Tensor,
) -> AttentionMetadata:
    """``meta`` (None: no sequence) with sequences of ``width`` rows appended up to ``bs``, each
    attending to ``width`` positions on the pool's scratch page (``scratch_pages`` holds its
    id, as many times as needed); ``out_slots`` are the padded step's ``bs * width`` write
    slots. Host arrays are pinned when ``scratch_pages`` is on CUDA."""
    per_seq = pages_for(width, page_size)
    n = 0 if meta is None else meta.num_seqs
    pad = bs - n
    pinned = scratch_pages.device.type == "cuda"
    kv_indptr = np.zeros(1, np.int32) if meta is None else meta.kv_indptr.numpy()
    kv_lens = np.empty(0, np.int32) if meta is None else meta.kv_lens.numpy()
    last = np.empty(0, np.int32) if meta is None else meta.last_page_len.numpy()
    tail = kv_indptr[-1] + per_seq * np.arange(1, pad + 1, dtype=np.int32)
    scratch = scratch_pages[: pad * per_seq]
    return AttentionMetadata(
        num_prefill=0 if width == 1 else bs,
        qo_indptr=host_tensor(width * np.arange(bs + 1, dtype=np.int32), pinned),
        kv_indptr=host_tensor(np.concatenate((kv_indptr, tail)), pinned),
        kv_lens=host_tensor(np.concatenate((kv_lens, np.full(pad, width, np.int32))), pinned),
        last_page_len=host_tensor(
            np.concatenate((last, np.full(pad, (width - 1) % page_size + 1, np.int32))), pinned
        ),
        kv_indices=scratch if meta is None else torch.cat((meta.kv_indices, scratch)),
        out_slots=out_slots[: bs * width],
        page_size=page_size,
    )


def capture(
    model: LlamaForCausalLM,
    attention: AttentionBackend,
    pool: KVPool,
    max_running: int,
    max_pages_per_seq: int,
    width: int,
    rank: int,
    mem_pool: Any = None,
) -> StepGraphs | None:
    """Graphs of ``width`` rows a sequence for up to ``max_running`` sequences (at most 256,
    and what the backend allows), captured into ``mem_pool`` (another set's, or a new one);
    None (their steps run eagerly) if capturing fails."""
    max_bs = min(max_running, 256, attention.graph_batch_limit(width))
    if max_bs < 1:
        return None
    graphs = StepGraphs(model, attention, pool, max_bs, max_pages_per_seq, width)
    kind = "decode" if graphs.width == 1 else f"verify (width {graphs.width})"
    try:
        seconds = graphs.capture(mem_pool)
    except RuntimeError as exc:
        log.warning("rank %d: CUDA graph capture failed, %s steps run eagerly: %s", rank, kind, exc)
        torch.cuda.synchronize()
        return None
    phases = graphs.capture_s.values()
    log.info(
        "rank %d: captured %d %s graphs in %.1fs (warm-up %.1fs, capture %.1fs)",
        rank,
        len(graphs.sizes),
        kind,
        seconds,
        sum(w for w, _ in phases),
        sum(c for _, c in phases),
    )
    return graphs
