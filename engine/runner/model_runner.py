"""Runs a scheduler ``Plan`` on the model: one forward pass, then sampling (on rank 0).

The runner owns the model shard, the paged KV pool and the attention backend of
its rank. Page ids in the plan index the pool directly; the pool has
``num_pages`` pages on every rank (the scheduler is configured with the same
number).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.distributed as dist

from engine.attention import ForwardBatch, get_backend
from engine.distributed.parallel import TPInfo, head_partition
from engine.kvcache.pool import KVPool
from engine.models.config import PRESETS, ModelConfig, get_preset
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import init_dummy, load_safetensors
from engine.models.setup import ModelNotFoundError, resolve_model
from engine.runner.args import RunnerArgs
from engine.runner.inputs import StepInputs, StepOutput
from engine.sampling.logprobs import TokenLogprob, prompt_logprobs, sampled_logprobs
from engine.sampling.sampler import Sampler
from engine.scheduler.plan import Plan

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


class ModelRunner:
    """The model of one tensor-parallel rank.

    With ``tp_size > 1`` the default ``torch.distributed`` group must already be
    initialized (``engine.runner.tp`` does it); every rank must call ``step``
    with the same plan, and only rank 0 returns tokens.
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
        self.dtype = args.torch_dtype()
        self.config, folder = load_config(args)
        self.eos_token_ids: list[int] = list(self.config.eos_token_ids)
        self.page_size = args.page_size
        self.model = LlamaForCausalLM(self.config, self.tp, self.dtype, self.device)
        if args.dummy_weights:
            init_dummy(self.model, args.seed)
        else:
            assert folder is not None
            load_safetensors(self.model, folder)
        self.model.eval()
        shard = head_partition(
            self.config.num_heads, self.config.num_kv_heads, self.tp.size, self.tp.rank
        )
        self.num_pages = self._agree(args.num_pages or self._default_num_pages(shard.kv_count))
        self.kv = KVPool(
            self.config.num_layers,
            self.num_pages,
            self.page_size,
            shard.kv_count,
            self.config.head_dim,
            self.dtype,
            self.device,
        )
        backend = get_backend(args.attention_backend, self.device.type)
        self.attention = backend(self.kv, shard.q_count, 1.0 / math.sqrt(self.config.head_dim))
        self.sampler = Sampler(self.device, args.seed, args.vocab_limit)
        log.info(
            "rank %d: %s on %s (%s), %d KV pages of %d tokens",
            tp_rank,
            args.model,
            self.device,
            self.dtype,
            self.num_pages,
            self.page_size,
        )

    def _default_num_pages(self, kv_heads: int) -> int:
        c = self.config
        page_bytes = KVPool.bytes_per_page(
            c.num_layers, self.page_size, kv_heads, c.head_dim, self.dtype
        )
        if self.device.type == "cuda":
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
                f"GiB, a page takes {page_bytes} bytes; raise mem_fraction or set num_pages"
            )
        return pages

    def _agree(self, num_pages: int) -> int:
        """The smallest page count over all ranks, so every rank can hold every page id."""
        if self.tp.size == 1:
            return num_pages
        t = torch.tensor([num_pages], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def _check_token_ids(self, inputs: StepInputs) -> None:
        vocab = self.config.vocab_size
        lows = [min(t) for t in inputs.prefill_tokens if t]
        highs = [max(t) for t in inputs.prefill_tokens if t]
        if inputs.decode_tokens:
            lows.append(min(inputs.decode_tokens))
            highs.append(max(inputs.decode_tokens))
        if lows and (min(lows) < 0 or max(highs) >= vocab):
            raise ValueError(
                f"token ids must be in [0, {vocab}), got values in [{min(lows)}, {max(highs)}]"
            )

    def _forward(self, plan: Plan, inputs: StepInputs) -> tuple[torch.Tensor, ForwardBatch] | None:
        """Run ``plan``; the hidden states of every row and the batch, on rank 0 only.

        None on ranks other than 0 and for plans without model work.
        """
        if not plan.has_model_work:
            return None
        self._check_token_ids(inputs)
        batch = ForwardBatch.build(
            plan,
            inputs.prefill_tokens,
            inputs.decode_tokens,
            self.page_size,
            self.num_pages,
            self.device,
        )
        self.attention.prepare(batch)
        hidden = self.model(batch.input_ids, batch.positions, self.attention)
        if self.tp.rank != 0:
            return None
        return hidden, batch

    @torch.inference_mode()
    def logits(self, plan: Plan, inputs: StepInputs) -> torch.Tensor | None:
        """Run ``plan``; float32 logits ``[N, vocab]`` of ``plan.sampling_rids()`` (rank 0 only).

        None on ranks other than 0 and for plans without model work.
        """
        out = self._forward(plan, inputs)
        if out is None:
            return None
        hidden, batch = out
        return self.model.compute_logits(hidden[batch.sample_rows])

    @torch.inference_mode()
    def step(self, plan: Plan, inputs: StepInputs) -> StepOutput:
        """Run ``plan``; the sampled token of each of ``plan.sampling_rids()`` (rank 0 only),
        with the log-probs the requests asked for."""
        n_sample = len(plan.sampling_rids())
        if len(inputs.sampling) != n_sample or len(inputs.output_index) != n_sample:
            raise ValueError(
                f"plan samples {n_sample} requests but inputs carry {len(inputs.sampling)} "
                f"sampling params and {len(inputs.output_index)} output indices"
            )
        out = self._forward(plan, inputs)
        if out is None:
            return StepOutput([])
        hidden, batch = out
        limit = self.sampler.vocab_limit
        tokens: list[int] = []
        logprobs: list[TokenLogprob | None] = []
        if n_sample:
            logits = self.model.compute_logits(hidden[batch.sample_rows])
            tokens = self.sampler.sample(logits, inputs.sampling, inputs.output_index)
            wanted = [p.logprobs for p in inputs.sampling]
            if any(k is not None for k in wanted):
                logprobs = sampled_logprobs(logits[:, :limit], tokens, wanted)
        prompt: list[list[TokenLogprob] | None] = []
        for span, req in zip(batch.prefill, inputs.prompt_logprobs, strict=False):
            if req is None:
                prompt.append(None)
                continue
            rows = self.model.compute_logits(hidden[span.row : span.row + len(req.targets)])
            prompt.append(prompt_logprobs(rows[:, :limit], req.targets, req.num_top))
        return StepOutput(tokens, logprobs, prompt)
