"""The roofline cost model: a step takes as long as its bytes or its FLOPs need.

    step = max(bytes / mem_bandwidth, flops / peak_flops) + kernels * kernel_floor
           + all-reduce time (tp > 1)

Per tensor-parallel rank (weights and attention heads split ``tp`` ways):

- bytes: every weight read once (layers and LM head), the KV of every context
  position read once, the KV of every new token written once. Activations are
  left out (small next to weights and KV at serving batch sizes).
- flops: 2 per matmul parameter per token (LM head only for sampled rows), plus
  attention: 4 * heads * head_dim per query-key pair per layer.
- kernels: ``9 * layers + 4`` launches a step (per layer: norm, QKV, rotary,
  attention, output projection, norm, gate-up, activation, down; then the
  embedding, final norm, LM head and sampler), each costing at least the
  measured graph-replay floor; ``2 * layers`` more all-reduces when tp > 1.
- all-reduce: two per layer of ``tokens * hidden`` activations; a ring moves
  ``2 (tp - 1) / tp`` of the bytes over one link direction.
"""

from __future__ import annotations

import numpy as np

from core.scheduler.shape import StepShape
from schema.models import ModelConfig
from sim.costs.base import GpuCostModel
from sim.costs.presets import DTYPE_BYTES, Hardware

KERNELS_PER_LAYER = 9
KERNELS_PER_STEP = 4


class RooflineCostModel(GpuCostModel):
    name = "roofline"

    def __init__(
        self,
        model: ModelConfig,
        hw: Hardware,
        tp: int = 1,
        dtype: str = "bf16",
        kv_dtype: str = "bf16",
        name: str | None = None,
    ) -> None:
        name = name or model.model_type
        if tp < 1 or model.num_heads % tp:
            raise ValueError(f"tp={tp} must divide {name}'s {model.num_heads} attention heads")
        if dtype not in hw.peak_flops:
            raise ValueError(
                f"no measured {dtype} peak for {hw.name}; have {sorted(hw.peak_flops)}"
            )
        self.model, self.hw, self.tp = model, hw, tp
        self.profile = None
        bpp = DTYPE_BYTES[dtype]
        kv_per_token = model.kv_bytes_per_token(DTYPE_BYTES[kv_dtype], tp)
        self._weight_bytes = model.weights_read_per_step * bpp / tp
        self._kv_token_bytes = kv_per_token
        self._layer_flops = 2.0 * model.num_layers * model.layer_params / tp
        self._head_flops = 2.0 * model.embedding_params / tp
        self._attn_flops = 4.0 * model.num_layers * model.num_heads * model.head_dim / tp
        self._bw = hw.mem_bandwidth
        self._peak = hw.peak_flops[dtype]
        kernels = KERNELS_PER_LAYER * model.num_layers + KERNELS_PER_STEP
        if tp > 1:
            kernels += 2 * model.num_layers
            self._allreduce_s_per_token = (
                2
                * model.num_layers
                * model.hidden_size
                * bpp
                * 2
                * (tp - 1)
                / tp
                / hw.link_bandwidth
            )
        else:
            self._allreduce_s_per_token = 0.0
        self._overhead = kernels * hw.kernel_floor_s
        self.provenance = (
            f"roofline for {name} ({model.num_params / 1e9:.3g}B params, {dtype}, kv {kv_dtype}) "
            f"on {tp}x {hw.name}: {hw.provenance}"
        )

    def step_time(self, shape: StepShape) -> float:
        tokens = shape.prefill_tokens + shape.decode_requests
        if tokens == 0:
            return 0.0
        mem = self._weight_bytes + (shape.context_tokens + tokens) * self._kv_token_bytes
        flops = (
            self._layer_flops * tokens
            + self._head_flops * shape.sampled
            + self._attn_flops * (shape.prefill_attention + shape.decode_context)
        )
        return (
            max(mem / self._bw, flops / self._peak)
            + self._overhead
            + self._allreduce_s_per_token * tokens
        )

    def decode_times(self, batch: int, context_tokens: int, longest: int, k: int) -> np.ndarray:
        ctx = context_tokens + batch * np.arange(k, dtype=np.float64)
        mem = self._weight_bytes + (ctx + batch) * self._kv_token_bytes
        flops = (self._layer_flops + self._head_flops) * batch + self._attn_flops * ctx
        return (
            np.maximum(mem / self._bw, flops / self._peak)
            + self._overhead
            + self._allreduce_s_per_token * batch
        )
