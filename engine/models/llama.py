"""Llama-family decoder (Llama 2/3/3.1, Mistral, Qwen2, Qwen3), tensor-parallel.

Module and parameter names follow the HF checkpoints (``model.layers.N.self_attn.q_proj``
and so on), so a safetensors file loads by name. Rank-local shapes come from
``engine.distributed.parallel``; the vocabulary and LM head stay replicated.

Forward works on a flat ``[T]`` batch of token ids in the row layout of
``ForwardBatch``; attention goes through the backend, which also owns the KV pool.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.backend import AttentionBackend
from engine.distributed.parallel import TPInfo, head_partition, split_range
from engine.models.config import ModelConfig
from engine.models.layers import ColumnParallelLinear, RMSNorm, RowParallelLinear, Shard
from engine.models.rotary import Rotary, apply_rotary


class LlamaAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, layer: int, tp: TPInfo, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.layer_id = layer
        shard = head_partition(config.num_heads, config.num_kv_heads, tp.size, tp.rank)
        d, h = config.head_dim, config.hidden_size
        self.num_q = shard.q_count
        self.num_kv = shard.kv_count
        self.head_dim = d
        bias = config.qkv_bias
        self.q_proj = ColumnParallelLinear(
            h, self.num_q * d, shard.q_start * d, bias, dtype, device
        )
        self.k_proj = ColumnParallelLinear(
            h, self.num_kv * d, shard.kv_start * d, bias, dtype, device
        )
        self.v_proj = ColumnParallelLinear(
            h, self.num_kv * d, shard.kv_start * d, bias, dtype, device
        )
        self.o_proj = RowParallelLinear(
            self.num_q * d, h, shard.q_start * d, config.o_bias, tp, dtype, device
        )
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, dtype, device)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_q, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        qk = apply_rotary(torch.cat((q, k), dim=1), cos, sin)
        o = attn.forward(self.layer_id, qk[:, : self.num_q], qk[:, self.num_q :], v)
        out: torch.Tensor = self.o_proj(o.reshape(t, self.num_q * self.head_dim))
        return out


class LlamaMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with the intermediate dimension split."""

    def __init__(
        self, config: ModelConfig, tp: TPInfo, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        h, bias = config.hidden_size, config.mlp_bias
        start, size = split_range(config.intermediate_size, tp.size, tp.rank)
        self.gate_proj = ColumnParallelLinear(h, size, start, bias, dtype, device)
        self.up_proj = ColumnParallelLinear(h, size, start, bias, dtype, device)
        self.down_proj = RowParallelLinear(size, h, start, bias, tp, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer: int, tp: TPInfo, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        eps, h = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = RMSNorm(h, eps, dtype, device)
        self.self_attn = LlamaAttention(config, layer, tp, dtype, device)
        self.post_attention_layernorm = RMSNorm(h, eps, dtype, device)
        self.mlp = LlamaMLP(config, tp, dtype, device)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        mlp_out: torch.Tensor = self.mlp(self.post_attention_layernorm(x))
        return x + mlp_out


class LlamaModel(nn.Module):
    def __init__(
        self, config: ModelConfig, tp: TPInfo, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, dtype=dtype, device=device
        )
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, tp, dtype, device) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)


class LlamaForCausalLM(nn.Module):
    """The whole model on one rank. ``forward`` returns final hidden states ``[T, hidden]``."""

    def __init__(
        self,
        config: ModelConfig,
        tp: TPInfo | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        self.config = config
        self.tp = tp or TPInfo()
        self.dtype = dtype
        device = torch.device(device)
        self.model = LlamaModel(config, self.tp, dtype, device)
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(
                config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device
            )
            self.lm_head.weight.requires_grad_(False)
        self.rotary = Rotary(config.head_dim, config.rope_theta, config.rope_scaling, device)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, attn)
        hidden: torch.Tensor = self.model.norm(x)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[N, vocab]`` of the given hidden rows."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()

    def parameter_shards(self) -> dict[str, Shard | None]:
        """Every parameter's HF name and how this rank's slice is cut from the full tensor."""
        shards: dict[str, Shard | None] = {}
        for name, _ in self.named_parameters():
            module_name, _, param_name = name.rpartition(".")
            module = self.get_submodule(module_name)
            shards[name] = getattr(module, "shards", {}).get(param_name)
        return shards
