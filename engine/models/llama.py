"""Llama-family decoder (Llama 2/3/3.1, Mistral, Qwen2, Qwen3), tensor-parallel.

Q, K and V run as one ``qkv_proj`` matmul and gate and up as one ``gate_up_proj``;
``checkpoint_tensors()`` maps the HF checkpoint names (``model.layers.N.self_attn.q_proj``
and so on) onto slices of those packed weights, so a safetensors file loads by name.
Rank-local shapes come from ``engine.distributed.parallel``; the vocabulary and LM
head stay replicated.

Forward works on a flat ``[T]`` batch of token ids in the row layout of the step
(see ``engine.attention.metadata``); attention goes through the backend, which also
owns the KV pool. The residual stream is carried next to the hidden state so that
each norm fuses the residual add (``RMSNorm.add_forward``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.backend import AttentionBackend
from engine.distributed.parallel import TPInfo, head_partition, split_range
from engine.models.layers import (
    CheckpointTensor,
    ColumnParallelLinear,
    Part,
    RMSNorm,
    RowParallelLinear,
)
from engine.models.ops import FusedOps, TorchOps
from engine.models.rotary import cos_sin_cache
from schema.models import ModelConfig

MAX_ROTARY_POSITIONS = 131072


class Build(NamedTuple):
    """What every module of the model is built from: the shape, this rank's place in the
    tensor-parallel group, the elementwise kernels, and where the weights live."""

    config: ModelConfig
    tp: TPInfo
    ops: TorchOps
    dtype: torch.dtype
    device: torch.device


class LlamaAttention(nn.Module):
    def __init__(self, b: Build, layer: int) -> None:
        super().__init__()
        config, tp, ops, dtype, device = b
        self.layer_id = layer
        self.ops = ops
        shard = head_partition(config.num_heads, config.num_kv_heads, tp.size, tp.rank)
        d, h = config.head_dim, config.hidden_size
        self.num_q, self.num_kv, self.head_dim = shard.q_count, shard.kv_count, d
        q_full, kv_full = config.num_heads * d, config.num_kv_heads * d
        parts = [
            Part("q_proj", q_full, shard.q_start * d, self.num_q * d),
            Part("k_proj", kv_full, shard.kv_start * d, self.num_kv * d),
            Part("v_proj", kv_full, shard.kv_start * d, self.num_kv * d),
        ]
        self.qkv_proj = ColumnParallelLinear(h, parts, config.qkv_bias, dtype, device)
        self.o_proj = RowParallelLinear(
            "o_proj",
            q_full,
            shard.q_start * d,
            self.num_q * d,
            h,
            config.o_bias,
            tp,
            dtype,
            device,
        )
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps, ops, dtype, device)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, ops, dtype, device)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        attn: AttentionBackend,
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        ops = self.ops
        store = attn.kv_store(self.layer_id) if isinstance(ops, FusedOps) else None
        if isinstance(ops, FusedOps) and store is not None:
            norms = None
            if self.q_norm is not None and self.k_norm is not None:
                norms = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            heads = (self.num_q, self.num_kv, self.head_dim)
            q = ops.qkv_rope_store(qkv, heads, positions, cos_sin, store, norms)
            o = attn.attend(self.layer_id, q)
        else:
            o = attn.forward(self.layer_id, *self._rotated_qkv(qkv, positions, cos_sin))
        out: torch.Tensor = self.o_proj(o.reshape(t, self.num_q * self.head_dim))
        return out

    def _rotated_qkv(
        self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K (QK-normed, rotated) and V as ``[T, heads, D]`` views or copies of ``qkv``."""
        t, d = qkv.shape[0], self.head_dim
        q_end, k_end = self.num_q * d, (self.num_q + self.num_kv) * d
        q = qkv[:, :q_end].view(t, self.num_q, d)
        k = qkv[:, q_end:k_end].view(t, self.num_kv, d)
        v = qkv[:, k_end:].view(t, self.num_kv, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.ops.rotary(positions, q, k, cos_sin)
        return q, k, v


class LlamaMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with the intermediate dimension split."""

    def __init__(self, b: Build) -> None:
        super().__init__()
        config, tp, ops, dtype, device = b
        self.ops = ops
        h, full, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        start, size = split_range(full, tp.size, tp.rank)
        parts = [Part("gate_proj", full, start, size), Part("up_proj", full, start, size)]
        self.gate_up_proj = ColumnParallelLinear(h, parts, bias, dtype, device)
        self.down_proj = RowParallelLinear(
            "down_proj", full, start, size, h, bias, tp, dtype, device
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(self, b: Build, layer: int) -> None:
        super().__init__()
        config, ops, dtype, device = b.config, b.ops, b.dtype, b.device
        eps, h = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = RMSNorm(h, eps, ops, dtype, device)
        self.self_attn = LlamaAttention(b, layer)
        self.post_attention_layernorm = RMSNorm(h, eps, ops, dtype, device)
        self.mlp = LlamaMLP(b)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` is the previous layer's output, ``residual`` the stream before it (None first)."""
        if residual is None:
            residual = x
            h = self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.self_attn(h, positions, cos_sin, attn)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, b: Build) -> None:
        super().__init__()
        config, ops, dtype, device = b.config, b.ops, b.dtype, b.device
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, dtype=dtype, device=device
        )
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(LlamaDecoderLayer(b, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops, dtype, device)


class LlamaForCausalLM(nn.Module):
    """The whole model on one rank. ``forward`` returns final hidden states ``[T, hidden]``."""

    def __init__(
        self,
        config: ModelConfig,
        tp: TPInfo | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        ops: TorchOps | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.tp = tp or TPInfo()
        self.dtype = dtype
        device = torch.device(device)
        self.model = LlamaModel(Build(config, self.tp, ops or TorchOps(), dtype, device))
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(
                config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device
            )
            self.lm_head.weight.requires_grad_(False)
        positions = min(config.max_position_embeddings, MAX_ROTARY_POSITIONS)
        self.cos_sin = cos_sin_cache(
            config.head_dim, config.rope_theta, config.rope_scaling, positions, device
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        for layer in self.model.layers:
            x, residual = layer(x, residual, positions, self.cos_sin, attn)
        assert residual is not None
        hidden, _ = self.model.norm.add_forward(x, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[N, vocab]`` of the given hidden rows."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()

    def checkpoint_tensors(self) -> Iterator[CheckpointTensor]:
        """Every checkpoint tensor this rank holds (HF name, full shape, slice, destination)."""
        for name, module in self.named_modules():
            if isinstance(module, ColumnParallelLinear | RowParallelLinear):
                yield from module.checkpoint_tensors(name.rpartition(".")[0] + ".")
            elif isinstance(module, RMSNorm | nn.Embedding | nn.Linear):
                for param_name, param in module.named_parameters(recurse=False):
                    full = f"{name}.{param_name}"
                    yield CheckpointTensor(full, tuple(param.shape), (slice(None),), param)
