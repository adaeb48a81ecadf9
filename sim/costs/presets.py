"""Model shapes and hardware ceilings that the cost models and KV sizing read.

A model's shape is the engine's own ``schema.models.ModelConfig`` of its preset
(``schema.models.PRESETS``, each from its model's published ``config.json``):
one class, one count of parameters and of KV bytes per token for both worlds.
Hardware numbers are measurements (see ``provenance``), never guesses.
"""

from __future__ import annotations

from dataclasses import dataclass

from schema.models import PRESETS, ModelConfig

DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5}


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


def model_shape(name: str) -> ModelConfig:
    """The preset ``name`` (exactly as ``PRESETS`` spells it)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None


def hardware(name: str) -> Hardware:
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"unknown hardware {name!r}; known: {sorted(HARDWARE)}") from None
