"""Model shapes and hardware ceilings that the cost models and KV sizing read.

Model shapes are the architecture presets both worlds share
(``schema.models.PRESETS``, each from its model's published ``config.json``),
seen as the counts a cost model needs. Hardware numbers are measurements (see
``provenance``), never guesses.
"""

from __future__ import annotations

from dataclasses import dataclass

from schema.models import PRESETS, ModelConfig

DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder-only transformer (Llama-style: GQA attention, gated MLP)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool

    @property
    def layer_params(self) -> int:
        """Matmul parameters of one layer (norm weights are negligible and left out)."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        return q_o + k_v + mlp

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        lm_head = 0 if self.tied_embeddings else self.embedding_params
        return self.layers * self.layer_params + self.embedding_params + lm_head

    @property
    def weights_read_per_step(self) -> int:
        """Parameters a forward pass reads in full: every layer and the LM head.

        The input embedding is a row lookup, so only the LM head's copy of the
        vocabulary matrix counts (tied or not).
        """
        return self.layers * self.layer_params + self.embedding_params

    def kv_bytes_per_token(self, kv_dtype: str) -> float:
        """K and V of one token over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[kv_dtype]

    @staticmethod
    def of(name: str, c: ModelConfig) -> ModelShape:
        return ModelShape(
            name,
            hidden=c.hidden_size,
            layers=c.num_layers,
            heads=c.num_heads,
            kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            intermediate=c.intermediate_size,
            vocab=c.vocab_size,
            tied_embeddings=c.tie_word_embeddings,
        )


MODELS: dict[str, ModelShape] = {name: ModelShape.of(name, c) for name, c in PRESETS.items()}


@dataclass(frozen=True, slots=True)
class Hardware:
    """Ceilings of one accelerator.

    ``mem_bandwidth`` is bytes moved per second, reads and writes together: a
    device-to-device copy of N bytes moves 2N bytes (N read, N written), and we
    take the copy's measured rate (read+write) as the rate of any mix of HBM
    traffic, so a pure read stream runs at the same number. ``kernel_floor_s``
    is the time of one tiny kernel replayed from a CUDA graph: the per-kernel
    floor of a step. ``link_bandwidth`` (per direction, bytes/s) feeds the
    tensor-parallel all-reduce term. ``host_bandwidth`` (per direction, bytes/s)
    and ``host_copy_latency_s`` (fixed time of one copy) price the host KV
    tier's copies between pinned host memory and the device
    (``sim.costs.copies``) when the profile has no copy rows.
    """

    name: str
    hbm_bytes: int
    mem_bandwidth: float
    peak_flops: dict[str, float]
    kernel_floor_s: float
    link_bandwidth: float
    host_bandwidth: float
    host_copy_latency_s: float
    provenance: str


HARDWARE: dict[str, Hardware] = {
    "h200": Hardware(
        name="h200",
        hbm_bytes=143771 * 2**20,
        mem_bandwidth=4.26e12,
        peak_flops={"bf16": 797e12, "fp16": 797e12},
        kernel_floor_s=1.05e-6,
        link_bandwidth=450e9,
        host_bandwidth=55.5e9,
        host_copy_latency_s=6e-6,
        provenance=(
            "H200 ceilings measured here: 4.26 TB/s device copy counting bytes read + written "
            "and 797 TFLOP/s bf16 8192^3 matmul (a first measurement; re-measured as 4.28 TB/s and "
            "791 TFLOP/s with 1.05 us per graph-replayed kernel in profiles/h200_ceilings.json); "
            "HBM 143771 MiB from nvidia-smi; NVLink 450 GB/s per direction is NVIDIA's H200 "
            "datasheet figure (900 GB/s bidirectional), not measured here; host<->device over "
            "PCIe 5.0 x16 (63 GB/s per direction nominal) measured here on 2026-12-01: pinned "
            "copies through PyTorch at 55.5 GB/s either way for 256 MiB and 1 GiB, and about "
            "6 us fixed per copy (1 MiB in 24 us, 256 KiB in 10.6 us)"
        ),
    ),
}


def model_shape(name: str) -> ModelShape:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(MODELS)}") from None


def hardware(name: str) -> Hardware:
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"unknown hardware {name!r}; known: {sorted(HARDWARE)}") from None
