"""Runs a scheduler ``Plan`` on the model: one forward pass, then sampling on the device.

The runner owns the model shard, the paged KV pool, the attention backend, the
request table (page tables on the device, see ``engine.runner.table``) and, on
CUDA, the CUDA graphs of its rank (``engine.runner.graphs``). Page ids in the plan index the pool
directly; the pool has ``num_pages`` pages on every rank (the scheduler is
configured with the same number).

A step, as ``launch`` runs it::

    host:   lay out the plan (numpy) -> one pinned upload -> page-table writes
    device: the plan's host KV tier copies (a side stream the step waits for)
            -> input ids (decode inputs may come from the previous step's samples)
            -> KV indices and write slots gathered from the table
            -> forward (a CUDA graph for decode and verify steps, eager otherwise)
            -> logits of the sampled rows -> sampling -> tokens copied to pinned memory
    host:   (``StepHandle.result()``) the verified tokens of the slots with a draft

A decode slot with a draft (speculative decoding) is laid out as an extend of
its token and its draft, every row sampled like a decode row at its output
index (``engine.runner.layout``); ``engine.sampling.verify`` keeps the draft's
accepted prefix and the model's next token. A step of verify spans, plain decode
slots and prefill chunks of at most ``1 + K`` rows each replays the verify graph of
``1 + K`` rows a slot (``engine.runner.graphs``); one with a longer chunk runs eagerly.

Nothing in ``launch`` waits for the device, so the caller can prepare the next
step while this one runs; ``StepHandle.result()`` waits. With ``time_steps`` set
(CUDA), every handle times its step's device work, from the upload of its
inputs to its tokens in pinned memory (``StepHandle.device_ms``); setting
``step_events`` to a list also appends each step's pair of timing events to it,
from which the idle time between steps follows. Every tensor-parallel
rank runs the same steps, samples the same tokens (identical logits, identical
generator), and so can feed them to the next step without rank 0.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from core.scheduler.config import SchedulerConfig, host_pages_for
from core.scheduler.pages import pages_for
from core.scheduler.plan import Plan
from engine.attention import AttentionMetadata, get_backend, resolve_name
from engine.distributed.parallel import TPInfo, head_partition
from engine.kvcache.host_pool import HostKVPool, device_ints
from engine.kvcache.pool import KVPool
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import init_dummy, load_safetensors
from engine.models.ops import get_ops
from engine.models.setup import ModelNotFoundError, resolve_model
from engine.runner.args import RunnerArgs
from engine.runner.device_step import DeviceStep
from engine.runner.graphs import StepGraphs, capture
from engine.runner.host_memory import keep_large_blocks
from engine.runner.inputs import FROM_LAST_SAMPLE, StepInputs, StepOutput
from engine.runner.layout import StepLayout
from engine.runner.staging import Staging
from engine.runner.step import StepHandle, StepLogprobs, recorded_event
from engine.runner.table import RequestTable
from engine.sampling.logprobs import PendingLogprobs, pending_logprobs
from engine.sampling.params import SamplingParams
from engine.sampling.sampler import Sampler, SamplingArrays
from engine.sampling.verify import expand_rows
from schema.models import PRESETS, ModelConfig, get_preset

log = logging.getLogger(__name__)


def load_config(args: RunnerArgs) -> tuple[ModelConfig, Path | None]:
    """The model's config and, unless dummy, its folder."""
    if args.dummy_weights and args.model.lower() in PRESETS:
        return get_preset(args.model), None
    try:
        folder = resolve_model(args.model)
    except ModelNotFoundError as exc:
        if args.dummy_weights:
            raise ModelNotFoundError(f"{exc}; dummy-weight presets: {sorted(PRESETS)}") from None
        raise
    return ModelConfig.from_dir(folder), folder


def device_for(args: RunnerArgs, tp_rank: int) -> torch.device:
    """The device of a rank: ``cuda`` (or ``cuda:K``) puts rank ``r`` on GPU ``K + r``."""
    device = torch.device(args.device)
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + tp_rank)


@dataclass(frozen=True, slots=True)
class _Forward:
    """One step's work on the device, up to the logits."""

    layout: StepLayout
    hidden: torch.Tensor  # [T, hidden]
    logits: torch.Tensor  # float32 [S, vocab]
    sampling: SamplingArrays
    row_params: list[SamplingParams]  # per sampled row
    started: torch.cuda.Event | None  # recorded before the upload, when steps are timed
    enqueued: float  # epoch seconds, just before the upload: the host work in front ends


class ModelRunner:
    """The model of one tensor-parallel rank.

    With ``tp_size > 1`` the default ``torch.distributed`` group must already be
    initialized (``engine.runner.tp`` does it); every rank must launch the same
    steps in the same order.
    """

    def __init__(self, args: RunnerArgs, tp_rank: int = 0) -> None:
        args.validate()
        self.args = args
        self.tp = TPInfo(tp_rank, args.tp_size)
        if self.tp.size > 1 and not dist.is_initialized():
            raise RuntimeError("tp_size > 1 needs torch.distributed initialized first")
        if args.cpu_threads > 0:
            torch.set_num_threads(args.cpu_threads)
        self.device = device_for(args, tp_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:  # the decode steps' large host blocks stay with the process
            keep_large_blocks()
        self.dtype = args.torch_dtype()
        self.config, folder = load_config(args)
        self.eos_token_ids: list[int] = list(self.config.eos_token_ids)
        core = args.scheduler
        self.page_size = core.page_size
        self.backend_name = resolve_name(
            args.attention_backend, self.device.type, self.dtype, self.config.head_dim
        )
        ops = get_ops(self.device, self.dtype, self.backend_name)
        self.model = LlamaForCausalLM(self.config, self.tp, self.dtype, self.device, ops)
        if args.dummy_weights:
            init_dummy(self.model, args.seed)
        else:
            assert folder is not None
            load_safetensors(self.model, folder)
        self.model.eval()
        shard = head_partition(
            self.config.num_heads, self.config.num_kv_heads, self.tp.size, self.tp.rank
        )
        self.num_pages = self._agree(core.num_pages or self._default_num_pages(shard.kv_count))
        c = self.config
        self.kv = KVPool(
            c.num_layers,
            self.num_pages,
            self.page_size,
            shard.kv_count,
            c.head_dim,
            self.dtype,
            self.device,
        )
        page_bytes = KVPool.bytes_per_page(
            c.num_layers, self.page_size, shard.kv_count, c.head_dim, self.dtype
        )
        self.host_pages = 0  # the host tier holds prefix cache pages: none without the cache
        if core.prefix_cache:
            host = host_pages_for(core.host_kv_gb, core.host_kv_pages, page_bytes)
            self.host_pages = self._agree(host)
        self.host_kv = HostKVPool(self.kv, self.host_pages) if self.host_pages else None
        backend = get_backend(self.backend_name, self.device.type, self.dtype, c.head_dim)
        self.attention = backend(self.kv, shard.q_count, 1.0 / math.sqrt(c.head_dim))
        self.max_pages_per_seq = min(
            pages_for(c.max_position_embeddings, self.page_size), self.num_pages
        )
        self.table = RequestTable(
            2 * core.max_running, self.max_pages_per_seq, self.num_pages, self.device
        )
        self.staging = Staging(self.device)
        self.sampler = Sampler(self.device, args.seed, args.vocab_limit)
        self.pinned = self.device.type == "cuda"
        self._last_rows: dict[str, int] = {}  # rid -> row of the last step's sampled tokens
        self._last_tokens: torch.Tensor | None = None
        self.step_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None
        self.time_steps = False
        self.graphs: StepGraphs | None = None  # decode steps
        self.verify_graphs: StepGraphs | None = None  # verify steps of 1 + K rows a slot
        if self.device.type == "cuda" and args.cuda_graph and backend.supports_graphs:
            self.graphs = self._capture_graphs(1)
            if core.num_draft_tokens and self.graphs is not None:
                self.verify_graphs = self._capture_graphs(1 + core.num_draft_tokens)
        log.info(
            "rank %d: %s on %s (%s, %s attention), %d KV pages of %d tokens",
            tp_rank,
            args.model,
            self.device,
            self.dtype,
            self.backend_name,
            self.num_pages,
            self.page_size,
        )

    def sized_scheduler(self) -> SchedulerConfig:
        """The core's settings as this runner built its pool: the sizes left out filled in."""
        return replace(self.args.scheduler, num_pages=self.num_pages, host_kv_pages=self.host_pages)

    def close(self) -> None:
        """Free the CUDA graphs; a rank calls it before it leaves its NCCL group.

        Graphs that captured NCCL all-reduces keep the communicator busy, and
        ``destroy_process_group`` then waits for them forever.
        """
        for graphs in (self.graphs, self.verify_graphs):
            if graphs is not None:
                graphs.release()
        self.graphs = self.verify_graphs = None

    def _capture_graphs(self, width: int) -> StepGraphs | None:
        """``engine.runner.graphs.capture`` on this rank, in the decode graphs' memory pool."""
        core, pool = self.args.scheduler, self.graphs.mem_pool if self.graphs else None
        parts = (self.model, self.attention, self.kv, core.max_running, self.max_pages_per_seq)
        return capture(*parts, width, self.tp.rank, pool)

    def _default_num_pages(self, kv_heads: int) -> int:
        c = self.config
        page_bytes = KVPool.bytes_per_page(
            c.num_layers, self.page_size, kv_heads, c.head_dim, self.dtype
        )
        if self.device.type == "cuda" and self.args.gpu_share > 1:
            # free memory says nothing while the other replicas are still loading
            _, total = torch.cuda.mem_get_info(self.device)
            share = self.args.mem_fraction / self.args.gpu_share
            budget = share * total - torch.cuda.memory_allocated(self.device)
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(
                self.device
            )
            budget = free + cached - (1.0 - self.args.mem_fraction) * total
        else:
            budget = min(
                self.args.cpu_kv_cache_gb * 2**30,
                self.args.cpu_max_kv_tokens / self.page_size * page_bytes,
            )
        pages = int(budget // page_bytes)
        if pages < 1:
            raise RuntimeError(
                f"no memory left for the KV cache on {self.device}: budget {budget / 2**30:.2f} "
                f"GiB, a page takes {page_bytes} bytes; raise --mem-fraction or set --num-pages"
            )
        return pages

    def _agree(self, num_pages: int) -> int:
        """The smallest page count over all ranks, so every rank can hold every page id."""
        if self.tp.size == 1:
            return num_pages
        t = torch.tensor([num_pages], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    # ------------------------------------------------------------------ steps
    @torch.inference_mode()
    def launch(self, plan: Plan, inputs: StepInputs) -> StepHandle:
        """Start ``plan`` on the device; the handle yields ``plan.sampling_rids()``'s tokens."""
        forward = self._forward(plan, inputs)
        if forward is None:
            return StepHandle(None)
        tokens = self.sampler.sample_tensor(forward.logits, forward.sampling)
        drafts = forward.layout.drafts
        self._last_tokens = tokens
        self._last_rows = forward.layout.single_rows(plan.sampling_rids())
        logprobs = self._logprobs(forward, tokens, inputs) if self.tp.rank == 0 else None
        handle = StepHandle(tokens, logprobs, forward.started, forward.enqueued, drafts)
        if self.step_events is not None and handle.timing is not None:
            self.step_events.append(handle.timing)
        return handle

    def _timing_event(self) -> torch.cuda.Event | None:
        """A timing event recorded now, when steps are timed (CUDA only)."""
        timed = self.time_steps or self.step_events is not None
        if not timed or self.device.type != "cuda":
            return None
        return recorded_event(timing=True)

    def _logprobs(
        self, forward: _Forward, tokens: torch.Tensor, inputs: StepInputs
    ) -> StepLogprobs | None:
        """The log-probs the step's requests asked for, computed on the device (see
        ``engine.sampling.logprobs``): over the model's distribution below the vocab limit."""
        limit = self._sampler_vocab()
        wanted = [p.logprobs for p in forward.row_params]
        rows = [i for i, k in enumerate(wanted) if k is not None]
        if not rows and not any(r is not None for r in inputs.prompt_logprobs):
            return None
        sampled = None
        if rows:
            logits, picked = forward.logits[:, :limit], tokens
            if len(rows) < len(wanted):  # some rows only (all rows need no gather)
                index = device_ints(rows, self.device)
                logits, picked = logits[index], tokens[index]
            sampled = pending_logprobs(logits, picked, [wanted[i] or 0 for i in rows])
        prompt: list[tuple[list[int], PendingLogprobs] | None] = []
        qo = forward.layout.qo_indptr
        for i, req in enumerate(inputs.prompt_logprobs):
            if req is None:
                prompt.append(None)
                continue
            n = len(req.targets)
            logits = self.model.compute_logits(forward.hidden[int(qo[i]) : int(qo[i]) + n])
            targets = device_ints(req.targets, self.device)
            prompt.append(
                (req.targets, pending_logprobs(logits[:, :limit], targets, [req.num_top] * n))
            )
        return StepLogprobs(rows, sampled, prompt)

    def step(self, plan: Plan, inputs: StepInputs) -> StepOutput:
        """Run ``plan`` and wait: the tokens of ``plan.sampling_rids()`` and their log-probs."""
        return self.launch(plan, inputs).result()

    @torch.inference_mode()
    def logits(self, plan: Plan, inputs: StepInputs) -> torch.Tensor | None:
        """Run ``plan`` without sampling; float32 logits ``[N, vocab]`` of ``plan.sampling_rids()``
        (a decode slot with a draft: one row per fed position).

        None for plans without model work.
        """
        forward = self._forward(plan, inputs)
        return None if forward is None else forward.logits

    def _forward(self, plan: Plan, inputs: StepInputs) -> _Forward | None:
        n_sample = len(plan.sampling_rids())
        if len(inputs.sampling) != n_sample or len(inputs.output_index) != n_sample:
            raise ValueError(
                f"plan samples {n_sample} requests but inputs carry {len(inputs.sampling)} "
                f"sampling params and {len(inputs.output_index)} output indices"
            )
        if plan.has_copies:
            if self.host_kv is None:
                raise ValueError("the plan carries host KV copies but there is no host KV pool")
            self.host_kv.run(plan.writes, plan.loads)
        layout = StepLayout.build(plan, inputs, self.page_size, self.config.vocab_size)
        source = self._sample_sources(plan, layout)
        self.table.release([*plan.aborted, *plan.preempted, *inputs.released])
        if not plan.has_model_work:
            return None
        slots, writes = self.table.assign(layout.rids, layout.pages)
        params, index = expand_rows(inputs.sampling, inputs.output_index, layout.drafts)
        sampling = SamplingArrays.build(params, index, self._sampler_vocab())
        enqueued = time.time()
        started = self._timing_event()
        step = DeviceStep.upload(layout, source, slots, writes, sampling, self.staging)
        ids = step.resolve_ids(self._last_tokens)
        meta = step.metadata(layout, self.table, self.pinned)
        hidden = self._run_model(layout, ids, step.positions, meta)
        logits = self.model.compute_logits(hidden.index_select(0, step.sample_rows))
        return _Forward(layout, hidden, logits, step.sampling, params, started, enqueued)

    def _run_model(
        self,
        layout: StepLayout,
        ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden: torch.Tensor | None = None
        if self.graphs is not None and layout.is_decode:
            bs = self.graphs.bucket(layout.num_seqs)
            if bs is not None and self.attention.graph_fits(meta, bs):
                hidden = self.graphs.replay(bs, ids, positions, meta)
        elif self.verify_graphs is not None:
            hidden = self.verify_graphs.replay_widened(ids, positions, meta)
        if hidden is None:
            self.attention.prepare(meta)
            hidden = self.model(ids, positions, self.attention)
        return hidden

    def _sample_sources(self, plan: Plan, layout: StepLayout) -> np.ndarray:
        """Per row: the row of the last step's samples that holds its input token, else -1."""
        source = np.full(layout.num_tokens, -1, dtype=np.int64)
        for seq in range(len(plan.prefill), layout.num_seqs):  # the decode slots
            first = int(layout.qo_indptr[seq])
            if layout.input_ids[first] != FROM_LAST_SAMPLE:
                continue
            rid = layout.rids[seq]
            row = self._last_rows.get(rid)
            if row is None:
                raise ValueError(
                    f"request {rid}: its input token comes from the previous step, "
                    "which sampled none for it (or verified a draft)"
                )
            source[first] = row
        return source

    def _sampler_vocab(self) -> int:
        limit = self.args.vocab_limit
        vocab = self.config.vocab_size
        return vocab if limit is None else min(vocab, limit)
